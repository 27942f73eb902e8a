"""livepush for Starlette and FastAPI apps (docs/frameworks.md#starlette-and-fastapi).

    from livepush.contrib.starlette import lifespan, current_session, page_topic
    app = FastAPI(lifespan=lifespan)                 # or with_livepush(your_lifespan)

- `lifespan`, `with_livepush`: open the pools publish(), enqueues and revoke() use when the app
  starts, close them when it stops.
- `current_session`, `optional_session`: the livepush session of the request's cookie, as a
  dependency (`Depends(current_session)`) or a plain call (`await current_session(request)`).
- `page_topic`, `SignedTopic`: a signed topic and the offset a page subscribes from.
- `aset_session_cookie` (at a sign-in: revokes another user's session first), `set_session_cookie`,
  `logout`: set the session cookie for a subject; revoke and delete it.

Needs Starlette (`pip install 'livepush[starlette]'`; FastAPI apps have it already).
"""

from __future__ import annotations

try:
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - only without the extra
    raise ImportError(
        "livepush.contrib.starlette needs Starlette: pip install 'livepush[starlette]' (a FastAPI app has it)"
    ) from exc

from .cookies import aset_session_cookie, logout, set_session_cookie
from .lifespan import lifespan, with_livepush
from .sessions import SessionRefused, SessionsUnavailable, current_session, optional_session
from .topics import PageTopic, SignedTopic, page_topic

__all__ = ["PageTopic", "SessionRefused", "SessionsUnavailable", "SignedTopic", "aset_session_cookie",
           "current_session", "lifespan", "logout", "optional_session", "page_topic", "set_session_cookie",
           "with_livepush"]
