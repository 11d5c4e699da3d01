"""What the running extender's process carries: its imports."""

import subprocess
import sys


def test_the_extender_imports_neither_the_official_client_nor_urllib3() -> None:
    # Issue 8: the official client was ~10 MiB at import and 21 MiB more once a
    # CoreV1Api was built, for three small writes that kube.rest now makes.
    code = (
        "import sys, cli.main, extender.service;"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'kubernetes', 'urllib3'}))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
