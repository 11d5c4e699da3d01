"""Components as real child processes: start, readiness, death, stop."""

import sys
from pathlib import Path

import pytest

from devcluster.process import Component, Probe, ProcessError


def _python(tmp_path: Path, name: str, code: str, probe: Probe | None = None) -> Component:
    return Component(
        name=name, argv=[sys.executable, "-c", code], log=str(tmp_path / f"{name}.log"), probe=probe
    )


def test_a_component_that_dies_is_reported_with_its_log(tmp_path: Path) -> None:
    component = _python(tmp_path, "crasher", "import sys; print('bad flag --x'); sys.exit(3)")
    component.start()

    with pytest.raises(ProcessError, match=r"crasher exited while starting(.|\n)*bad flag --x"):
        component.wait_ready(10)
    component.stop()


def test_stop_ends_a_running_component_and_survives_a_reload(tmp_path: Path) -> None:
    component = _python(tmp_path, "sleeper", "import time; time.sleep(60)")
    component.start()
    component.wait_ready(10)
    assert component.alive()
    # As `headroom cluster down` sees it: loaded from the state file, not our child.
    reloaded = Component.from_json(component.to_json())
    assert reloaded.alive()

    component.stop(grace=5)

    assert not component.alive()
    assert component.pid is None


def test_a_probe_that_never_answers_times_out_naming_the_url(tmp_path: Path) -> None:
    probe = Probe("http://127.0.0.1:9/readyz")
    component = _python(tmp_path, "silent", "import time; time.sleep(60)", probe)
    component.start()
    try:
        with pytest.raises(ProcessError, match=r"silent not ready after 1s \(http://127.0.0.1:9"):
            component.wait_ready(1)
    finally:
        component.stop(grace=5)
