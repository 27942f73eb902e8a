"""A site's subject module with a mistake that only importing it finds: the NameError of a name
it never defined, raised at its top."""

from typing import Any

PREFIX = SITE_PREFIX + "-"  # noqa: F821 - the mistake this module is for


def subject(user: Any) -> str:
    return PREFIX + str(user.pk)
