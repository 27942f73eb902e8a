"""An --app module for the security tests: `livepush serve --app tests.support.security_app:app`."""

from __future__ import annotations

import livepush

RULES = [
    livepush.Allow("public:*", anonymous=True),  # anyone, with a session or not
    livepush.Allow("user:{subject}"),  # only the session whose subject fills the slot
]

app = livepush.App(rules=RULES)

# Re-checks open sessions five times a second, so tests see expiry and missed revocations fast.
fast_reverify = livepush.App(rules=RULES, reverify_interval=0.2)

not_an_app = {"rules": RULES}
