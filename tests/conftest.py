"""Settings for the whole suite."""

from hypothesis import HealthCheck, settings

# Property tests assert behaviour, never speed: on a shared 2-core machine a
# slow example is noise, so no per-example deadline and no too-slow check.
settings.register_profile("headroom", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("headroom")
