"""Settings for the whole suite."""

import os

from hypothesis import HealthCheck, settings

# Property tests assert behaviour, never speed: on a shared 2-core machine a
# slow example is noise, so no per-example deadline and no too-slow check.
settings.register_profile("headroom", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI explores the same examples every run, so a red build is reproducible;
# developers' runs keep exploring new ones (and their finds become examples).
settings.register_profile("ci", parent=settings.get_profile("headroom"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "headroom")
