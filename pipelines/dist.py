"""`make dist` (`python -m pipelines.dist --out dist`): what `spark-submit --py-files` needs (SPEC §6.2).

- `replab-<version>.zip`: the importable packages (`PACKAGES`) with their data files (`conf/` YAML and
  properties), laid out from the zip root as Python's zipimport wants. Entries are sorted and carry a fixed
  timestamp, so the same sources give the same bytes. This is the `--py-files` artifact.
- `replab-<version>-py3-none-any.whl`: the same packages as a wheel (`pip wheel --no-deps`), for clusters that
  install libraries instead (Databricks jobs, `pip install` in an image). Building it needs setuptools from the
  package index; when that is out of reach the zip alone is built and the reason is printed.

The entry points stay scripts, passed to spark-submit by path: `pipelines/replay_job.py`,
`pipelines/generate_job.py`, `pipelines/sweep_job.py`. Python's dependencies (pyspark's pandas/pyarrow, numpy,
PyYAML, great-expectations, mlflow) come from the cluster's Python (`PYSPARK_PYTHON`), Delta's jars from
`--packages` (`storage.session.delta_package()`).
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from schemas.layout import PACKAGES as FLOOR_PACKAGES
from schemas.version import __version__

REPO = Path(__file__).resolve().parent.parent
#: The top-level packages (pyproject.toml's [tool.setuptools] packages), bottom floor first (`schemas.layout`);
#: a reserved floor not written yet (testbed) is skipped.
PACKAGES: tuple[str, ...] = tuple(p for p in FLOOR_PACKAGES if (REPO / p / "__init__.py").is_file())
#: Data files the packages read at run time (pyproject.toml's package-data).
DATA_SUFFIXES: tuple[str, ...] = (".yaml", ".json", ".properties", ".css")
#: zip entries need a date; 1980-01-01 (the format's epoch) keeps the archive reproducible.
_FIXED_DATE = (1980, 1, 1, 0, 0, 0)
ENTRY_POINTS: dict[str, str] = {
    "replay": "pipelines/replay_job.py",
    "generate": "pipelines/generate_job.py",
    "sweep": "pipelines/sweep_job.py",
}


@dataclass
class Distribution:
    zip_path: Path
    wheel_path: Path | None
    zip_entries: int
    wheel_problem: str | None = None


def package_files(root: Path = REPO) -> Iterator[tuple[Path, str]]:
    """(file, name inside the archive) for every source and data file of the packages, sorted."""
    for package in PACKAGES:
        for file in sorted((root / package).rglob("*")):
            if not file.is_file() or "__pycache__" in file.parts:
                continue
            if file.suffix == ".py" or file.suffix in DATA_SUFFIXES:
                yield file, file.relative_to(root).as_posix()


def build_zip(out_dir: Path, root: Path = REPO) -> tuple[Path, int]:
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"replab-{__version__}.zip"
    partial = target.with_suffix(".zip.partial")
    count = 0
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file, name in package_files(root):
            info = zipfile.ZipInfo(name, date_time=_FIXED_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, file.read_bytes())
            count += 1
    partial.replace(target)  # a half-written zip never sits under the final name
    return target, count


def build_wheel(out_dir: Path, root: Path = REPO) -> tuple[Path | None, str | None]:
    """The wheel through pip (setuptools backend of pyproject.toml); (None, reason) when pip cannot build."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("replab-*.whl"):
        old.unlink()
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir",
                           str(out_dir), str(root)], capture_output=True, text=True, timeout=600)
    wheels = sorted(out_dir.glob(f"replab-{__version__}-*.whl"))
    if proc.returncode != 0 or not wheels:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return None, lines[-1] if lines else f"pip wheel exited with {proc.returncode}"
    return wheels[-1], None


def build(out_dir: str | Path, *, wheel: bool = True) -> Distribution:
    out = Path(out_dir)
    zip_path, entries = build_zip(out)
    wheel_path, problem = build_wheel(out) if wheel else (None, "not requested")
    return Distribution(zip_path, wheel_path, entries, problem)


def spark_submit_command(zip_path: Path | str, *, master: str = "local[*]", job: str = "replay",
                         job_args: Sequence[str] = ("--trace", "TRACE_DIR", "--policy", "kafka-durable",
                                                    "--lakehouse", "lakehouse"),
                         packages: str | None = None, jars: Sequence[str] = ()) -> list[str]:
    """The spark-submit invocation of an entry point (SPEC §6.2), as an argument list.

    Delta comes from `--packages` (Maven Central), or from `--jars` when given (an offline cluster with the
    jars already at hand); the session factory then adds Delta's SQL extension and catalog itself.
    """
    from storage.session import delta_package

    cmd = ["spark-submit", "--master", master, "--py-files", str(zip_path)]
    if jars:
        cmd += ["--jars", ",".join(jars)]
    else:
        cmd += ["--packages", packages or delta_package()]
    return [*cmd, ENTRY_POINTS[job], *job_args]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipelines.dist", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="dist", help="output folder (default ./dist)")
    parser.add_argument("--no-wheel", action="store_true", help="build the --py-files zip only")
    args = parser.parse_args(argv)
    dist = build(args.out, wheel=not args.no_wheel)
    print(f"zip:   {dist.zip_path} ({dist.zip_entries} files; pass it to --py-files)")
    if dist.wheel_path:
        print(f"wheel: {dist.wheel_path} (pip install on the cluster, or a Databricks library)")
    else:
        print(f"wheel: not built ({dist.wheel_problem}); the zip is all spark-submit needs")
    print("\nRun from the repository root, with PYSPARK_PYTHON naming a Python that has requirements.txt installed")
    print("(here: export PYSPARK_PYTHON=$PWD/.venv/bin/python):\n")
    for job, job_args in (("replay", ("--trace", "TRACE_DIR", "--policy", "kafka-durable", "--policy", "kafka-acks1",
                                       "--lakehouse", "lakehouse")),
                          ("generate", ("--scenario", "demo", "--seed", "1", "--out", "traces/demo-s1")),
                          ("sweep", ("--scenario", "flaky-network", "--seeds", "20", "--scale", "0.2", "--policy",
                                     "kafka-acks1", "--policy", "kafka-durable", "--no-mlflow"))):
        print("  " + shlex.join(spark_submit_command(dist.zip_path, job=job, job_args=job_args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
