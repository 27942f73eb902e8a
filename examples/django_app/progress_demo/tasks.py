"""The example's one task: an "import" in a few steps, each reported live on its job topic."""

import time

from livepush.contrib.django import progress

try:
    from django.tasks import task
except ImportError:  # Django 5.2 on Python 3.11: the backport
    from django_tasks import task


@task
def import_rows(steps: int = 5, pause: float = 0.3) -> dict:
    """Pretend to import `steps` rows, reporting progress after each."""
    progress(0, steps, "starting")
    for done in range(1, steps + 1):
        time.sleep(pause)  # the work of one row
        progress(done, steps, f"row {done} of {steps}")
    return {"rows": steps}
