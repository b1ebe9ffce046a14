"""Build and run the Java example runner (`examples/java-runner/`) with the machine's Maven.

`build()` runs `mvn package` when a source or the POM is newer than the build output (jars
come from Maven Central once, then from ~/.m2); `command()` is the `java` command line to run it.

    .venv/bin/python -m tools.java_runner build
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1] / "examples" / "java-runner"
TARGET = PROJECT / "target"
MAIN_CLASS = "io.reconciler.example.Runner"
BUILD_TIMEOUT_S = 600


class JavaRunnerError(Exception):
    """The Java runner could not be built; the message says what to install or check."""


def _require(tool: str, fix: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise JavaRunnerError(f"`{tool}` is not on PATH. Fix: {fix}")
    return path


def _stale() -> bool:
    stamp = TARGET / "java-runner-1.jar"
    if not stamp.exists() or not (TARGET / "lib").is_dir():
        return True
    built = stamp.stat().st_mtime
    sources = [PROJECT / "pom.xml", *(PROJECT / "src").rglob("*.java")]
    return any(path.stat().st_mtime > built for path in sources)


def build() -> None:
    """Compile the runner and copy its runtime jars to target/lib (skipped when up to date)."""
    if not _stale():
        return
    mvn = _require("mvn", "install Apache Maven 3.8+ (apt-get install maven).")
    _require("java", "install a JDK 17+ (apt-get install openjdk-17-jdk-headless).")
    done = subprocess.run(
        [mvn, "-q", "-B", "package"],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise JavaRunnerError(
            f"mvn package failed in {PROJECT}:\n{tail}\nFix: check that Maven Central is "
            "reachable (mvn settings, proxy) and that the JDK is 17 or newer."
        )


def command(*args: str) -> list[str]:
    """The command line that runs the built runner with ``args``."""
    java = _require("java", "install a JDK 17+ (apt-get install openjdk-17-jdk-headless).")
    classpath = f"{TARGET / 'classes'}:{TARGET / 'lib'}/*"
    return [java, "-cp", classpath, MAIN_CLASS, *args]


def main(argv: list[str]) -> int:
    if argv != ["build"]:
        print("usage: python -m tools.java_runner build", file=sys.stderr)
        return 2
    try:
        build()
    except JavaRunnerError as exc:
        print(f"java_runner: {exc}", file=sys.stderr)
        return 1
    print(f"java runner built: {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
