"""Apache RocketMQ's jars (broker, NameServer, controller, client, tools; DLedger comes with the broker), resolved
once from Maven Central and cached (SPEC §12), and the client harness (`harness/ReplabHarness.java`) compiled
against them.

The version is pinned in one place, `testbed/rocketmq/pom.xml`; `mvn dependency:copy-dependencies` on it fills
`.cache/rocketmq/lib/` (or `$REPLAB_ROCKETMQ_DIR/lib`) the first time, and every later run starts offline. The
harness is compiled with javac into a folder named by its source's hash, so an edited harness is rebuilt.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from testbed.jars import TestbedUnavailable, copy_dependencies, pinned_version

POM = Path(__file__).resolve().parent / "pom.xml"
HARNESS_SOURCE = Path(__file__).resolve().parent / "harness" / "ReplabHarness.java"
HARNESS_CLASS = "ReplabHarness"
_REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def rocketmq_dir() -> Path:
    return Path(os.environ.get("REPLAB_ROCKETMQ_DIR", _REPO_ROOT / ".cache" / "rocketmq"))


@dataclass(frozen=True)
class RocketMQJars:
    lib: Path  # every jar of the brokers', the NameServer's and the client's classpath
    harness: Path  # the compiled client harness
    version: str

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")

    @property
    def harness_classpath(self) -> str:
        return f"{self.harness}{os.pathsep}{self.lib / '*'}"


def _complete(lib: Path, version: str) -> bool:
    return all((lib / f"rocketmq-{m}-{version}.jar").is_file()
               for m in ("broker", "namesrv", "controller", "client", "tools"))


def ensure_jars(*, log=print) -> RocketMQJars:
    """The cached jars and harness, resolving and compiling on first use; a clear error when that is impossible."""
    version = pinned_version("rocketmq.version", POM)
    root = rocketmq_dir()
    lib = root / "lib"
    if not _complete(lib, version):
        log(f"resolving Apache RocketMQ {version} from Maven Central into {root} (once)")
        staging = copy_dependencies(POM, root / "staging", f"RocketMQ {version}")
        shutil.rmtree(lib, ignore_errors=True)
        staging.replace(lib)
        if not _complete(lib, version):
            raise TestbedUnavailable(f"{lib} lacks RocketMQ {version}'s jars after mvn ran")
    return RocketMQJars(lib, _harness(lib, root, log), version)


def _harness(lib: Path, root: Path, log) -> Path:
    digest = hashlib.sha256(HARNESS_SOURCE.read_bytes()).hexdigest()[:12]
    classes = root / "harness" / digest
    if (classes / f"{HARNESS_CLASS}.class").is_file():
        return classes
    javac = shutil.which("javac")
    if javac is None:
        raise TestbedUnavailable("the RocketMQ testbed compiles its client harness and needs a JDK (javac not found)")
    log(f"compiling the RocketMQ client harness into {classes}")
    staging = classes.with_name(f"{digest}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    proc = subprocess.run([javac, "-nowarn", "-d", str(staging), "-cp", str(lib / "*"), str(HARNESS_SOURCE)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise TestbedUnavailable(f"javac could not compile {HARNESS_SOURCE.name}: {proc.stderr.strip()[-500:]}")
    shutil.rmtree(classes, ignore_errors=True)
    staging.replace(classes)
    return classes
