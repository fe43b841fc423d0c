"""The README's examples run as written."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    cpu = [b for b in blocks if not b.startswith("# GPU only")]
    assert len(cpu) >= 2
    for code in blocks:
        compile(code, "README.md", "exec")  # GPU-only examples must at least parse
    for code in cpu:
        subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, capture_output=True)


def test_readme_test_command_is_what_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert f"```bash\n{ci}\n```" in README
