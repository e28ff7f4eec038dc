"""Apache Kafka's jars and the Jolokia JVM agent, resolved once from Maven Central and cached (SPEC §12).

The versions are pinned in one place, `testbed/pom.xml`; `mvn dependency:copy-dependencies` on it fills
`.cache/kafka/lib/` (or `$REPLAB_KAFKA_DIR/lib`) the first time, and every later run starts offline.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from schemas.errors import ReplabError

POM = Path(__file__).resolve().parent / "pom.xml"
_REPO_ROOT = Path(__file__).resolve().parent.parent


class TestbedUnavailable(ReplabError):
    """Something the testbed needs on this machine is missing (Java, Maven, network namespaces): exit 1."""


def pinned_version(name: str, pom: Path = POM) -> str:
    """`kafka.version` / `jolokia.version` (or another pom's property) from the pom's <properties>: the one place
    they are pinned."""
    match = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom.read_text())
    if not match:
        raise ReplabError(f"{pom}: no <{name}> property")
    return match.group(1).strip()


def kafka_dir() -> Path:
    return Path(os.environ.get("REPLAB_KAFKA_DIR", _REPO_ROOT / ".cache" / "kafka"))


@dataclass(frozen=True)
class KafkaJars:
    lib: Path  # every jar of the broker's classpath
    agent: Path  # the Jolokia JVM agent (-javaagent)
    version: str

    @property
    def classpath(self) -> str:
        return str(self.lib / "*")


def java_binary() -> str:
    java = shutil.which("java")
    if java is None:
        raise TestbedUnavailable("the testbed needs Java 17+ on PATH to run Kafka brokers (java not found)")
    return java


def _complete(lib: Path, version: str) -> bool:
    return (lib / f"kafka_2.13-{version}.jar").is_file() and (lib / f"kafka-clients-{version}.jar").is_file()


def copy_dependencies(pom: Path, staging: Path, what: str) -> Path:
    """`mvn dependency:copy-dependencies` of `pom` into a fresh `staging` folder (the caller moves it in place)."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise TestbedUnavailable(f"{what}'s jars are not cached and Maven (mvn) is not installed to resolve them "
                                 f"from Maven Central ({pom.relative_to(_REPO_ROOT)})")
    shutil.rmtree(staging, ignore_errors=True)
    proc = subprocess.run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
                           f"-DoutputDirectory={staging}"], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
        raise TestbedUnavailable(f"mvn could not resolve {pom.relative_to(_REPO_ROOT)}: {' | '.join(tail)}")
    return staging


def ensure_jars(*, log=print) -> KafkaJars:
    """The cached jars, resolving them with Maven on first use; a clear error when that is impossible."""
    version, agent_version = pinned_version("kafka.version"), pinned_version("jolokia.version")
    root = kafka_dir()
    lib, agent = root / "lib", root / "agent" / f"jolokia-agent-jvm-{agent_version}-javaagent.jar"
    if _complete(lib, version) and agent.is_file():
        return KafkaJars(lib, agent, version)
    log(f"resolving Apache Kafka {version} and Jolokia {agent_version} from Maven Central into {root} (once)")
    staging = copy_dependencies(POM, root / "staging", f"Kafka {version}")
    # The agent is a separate classifier jar: it goes beside the classpath, not on it.
    agent.parent.mkdir(parents=True, exist_ok=True)
    found = list(staging.glob("jolokia-agent-jvm-*-javaagent.jar"))
    if not found:
        raise TestbedUnavailable("mvn resolved testbed/pom.xml but returned no Jolokia javaagent jar")
    found[0].replace(agent)
    shutil.rmtree(lib, ignore_errors=True)
    staging.replace(lib)
    if not _complete(lib, version):
        raise TestbedUnavailable(f"{lib} lacks kafka_2.13-{version}.jar after mvn ran")
    return KafkaJars(lib, agent, version)
