"""An --app module whose rule says anonymous="no", as a setting read from the environment as text
would: `livepush serve --app tests.support.security_app_anonymous_text:app`."""

from __future__ import annotations

import livepush

app = livepush.App(rules=[livepush.Allow("team:*", anonymous="no")])  # type: ignore[arg-type]
