"""What the notebooks in `notebooks/` need to run unchanged on Databricks and as plain scripts (SPEC §6.3).

A notebook calls `env = notebook_env(globals(), "01_overview")` once, then:

- `env.spark`: the notebook's `spark` on Databricks, else `storage.session.get_spark` (which returns the
  session already running in the process: the test suite's, when a test runs the notebook with runpy);
- `env.param(name, default)`: a `dbutils.widgets` text widget on Databricks, else the environment variable
  `REPLAB_NB_<NAME>` (upper case), else the default. Defaults are small, so a local run takes minutes;
- `env.workdir`: where the notebook writes (param `workdir`): on Databricks a Unity Catalog volume path such as
  `/Volumes/main/default/replab`, which Spark and Python's file API both read (the lakehouse and the generated
  traces are written through both); locally `./notebook-runs`;
- `env.show(frame)` / `env.show_figure(fig, name)`: `display` on Databricks, print / PNG file locally (figures
  are saved as PNG under `env.out` in both cases, so a run leaves its plots behind).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

DATABRICKS_DEFAULT_WORKDIR = "/Volumes/main/default/replab"
LOCAL_DEFAULT_WORKDIR = "notebook-runs"
ENV_PREFIX = "REPLAB_NB_"


@dataclass
class NotebookEnv:
    name: str
    spark: Any
    dbutils: Any = None
    display: Any = None
    figures: dict[str, Path] = field(default_factory=dict)

    @property
    def on_databricks(self) -> bool:
        return self.dbutils is not None

    def param(self, name: str, default: str, label: str | None = None) -> str:
        if self.dbutils is not None:
            self.dbutils.widgets.text(name, default, label or name)
            return self.dbutils.widgets.get(name).strip()
        return os.environ.get(ENV_PREFIX + name.upper(), default).strip()

    def flag(self, name: str, default: bool) -> bool:
        text = self.param(name, "true" if default else "false").lower()
        return text in ("1", "true", "yes", "on")

    @cached_property
    def workdir(self) -> Path:
        default = DATABRICKS_DEFAULT_WORKDIR if self.on_databricks else LOCAL_DEFAULT_WORKDIR
        return Path(self.param("workdir", default)).resolve()

    @property
    def out(self) -> Path:
        """This notebook's own output folder (tables as CSV, figures as PNG)."""
        path = self.workdir / self.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def show(self, frame: Any, title: str | None = None) -> None:
        if self.display is not None:
            self.display(frame)
            return
        import pandas as pd

        if title:
            print(f"\n== {title}")
        if isinstance(frame, pd.DataFrame):
            with pd.option_context("display.max_columns", None, "display.width", 200,
                                   "display.max_colwidth", 60):
                print(frame.to_string(index=False))
        else:
            print(frame)

    def show_figure(self, fig: Any, name: str) -> Path:
        """Save the figure as `<out>/<name>.png` and show it (Databricks renders it inline)."""
        import matplotlib.pyplot as plt

        path = self.out / f"{name}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        self.figures[name] = path
        if self.display is not None:
            self.display(fig)
        else:
            print(f"figure: {path}")
        plt.close(fig)
        return path


def notebook_env(namespace: Mapping[str, Any] | MutableMapping[str, Any], name: str) -> NotebookEnv:
    """The environment of a notebook, from its globals (Databricks puts spark, dbutils and display there)."""
    import matplotlib

    dbutils = namespace.get("dbutils")
    if dbutils is None:
        matplotlib.use("Agg")  # a script or a test has no screen; Databricks keeps its own backend
    spark = namespace.get("spark")
    if spark is None:
        from storage.session import get_spark

        spark = get_spark(f"replab-notebook-{name}")
    return NotebookEnv(name, spark, dbutils, namespace.get("display") if dbutils is not None else None)


def split_list(text: str) -> list[str]:
    """A widget's list: items separated by ';' (policy strings contain commas) or new lines."""
    return [item.strip() for item in text.replace("\n", ";").split(";") if item.strip()]
