"""An --app module that configures logging as a Django project's LOGGING does (dictConfig), with
livepush's loggers at DEBUG: `livepush serve --app tests.support.security_app_debug_logging:app`."""

from __future__ import annotations

import logging.config

import livepush

# Done at import, after livepush's own modules are loaded: dictConfig then resets the level of
# every existing logger under a configured one ("livepush.websockets" among them) to NOTSET.
logging.config.dictConfig({
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": "ext://sys.stderr"}},
    "loggers": {"livepush": {"level": "DEBUG", "handlers": ["stderr"], "propagate": False}},
})

app = livepush.App(rules=[livepush.Allow("public:*", anonymous=True)])
