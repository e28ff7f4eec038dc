"""The floors of the house: replab's packages from the bottom up, the one place their order is written.

A module may import from its own floor and the floors below it, never above (`tests/test_layout.py` walks every
import, those inside functions too, and also fails on any import cycle between modules). `make dist` zips the
package floors; notebooks/, bench/ and tests/ sit on top and are not shipped.
"""

from __future__ import annotations

#: Bottom to top. Packages on one floor (schemas and conf) may import each other, cycles aside.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("schemas", "conf"),  # table and trace schemas, errors, the version; conf/ data (policies, scenarios)
    ("replay",),  # policies, reference interpreters, kernels: no Spark
    ("generators",),  # scenarios → synthetic traces
    ("storage",),  # Spark session, the lakehouse (the one Delta writer), trace loader, report queries
    ("expectations",),  # the trace and output gates (read storage)
    ("engine",),  # the replay plan, group replay on executors, publish, metrics, MLflow; engine/stream/
    ("report",),  # plots, run figures, comparison findings and tables, the HTML pages (reads MLflow and storage)
    ("testbed",),  # SPEC §12: a real Kafka cluster beside every prediction (records traces, compares)
    ("studies",),  # questions answered by replaying (the DLedger-vs-Kafka study), runnable with `python -m`
    ("pipelines",),  # the CLI, spark-submit jobs, `make dist`, notebook set-up: thin
    ("notebooks", "bench", "tests"),  # on top: import anything, imported by nothing below
)

#: The importable packages, bottom to top (what pyproject.toml installs and `make dist` zips).
PACKAGES: tuple[str, ...] = tuple(p for floor in FLOORS[:-1] for p in floor)
