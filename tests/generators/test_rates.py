"""Failure-rate files: the shipped default parses and cites a source for every rate; a missing or bad key is
BadInput (exit 2) naming the file and the key."""

from __future__ import annotations

import pytest
import yaml

import conf
from generators.rates import PROCESSES, load_rates
from pipelines.cli import main
from schemas.errors import BadInput


def test_default_rates_have_every_process_with_a_source():
    rates = load_rates()
    assert rates.names == tuple(PROCESSES)
    for p in rates.processes:
        assert p.per_year > 0 and len(p.source) > 10
    disk = rates["disk_loss"]
    assert disk.fixed_extra_s == pytest.approx(750 * 1000 / 50)  # rebuild: data / bandwidth
    assert rates.scaled(rate={"disk_loss": 2.0})["disk_loss"].per_year == pytest.approx(2 * disk.per_year)


def _write(tmp_path, mutate) -> str:
    raw = yaml.safe_load(conf.path("rates", "default.yaml").read_text())
    mutate(raw)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw))
    return str(path)


@pytest.mark.parametrize(("mutate", "key"), [
    (lambda r: r["processes"]["crash"].pop("per_year"), "processes.crash.per_year"),
    (lambda r: r["processes"]["disk_loss"].update(per_year=-1), "processes.disk_loss.per_year"),
    (lambda r: r["processes"]["isolate"].pop("source"), "processes.isolate.source"),
    (lambda r: r["processes"].pop("rack_power_loss"), "processes.rack_power_loss"),
    (lambda r: r["processes"]["crash"].update(restart_s={"dist": "lognormal", "median": 60}),
     "processes.crash.restart_s.sigma"),
    (lambda r: r["processes"]["crash"].update(mtbf=3), "processes.crash.mtbf"),
])
def test_bad_or_missing_key_names_it(tmp_path, mutate, key):
    path = _write(tmp_path, mutate)
    with pytest.raises(BadInput) as err:
        load_rates(path)
    assert f"'{key}'" in str(err.value) and "r.yaml" in str(err.value)


def test_cli_exits_2_naming_the_key(tmp_path, capsys):
    path = _write(tmp_path, lambda r: r["processes"]["crash"].pop("per_year"))
    assert main(["durability", "--rates", path, "--no-mlflow"]) == 2
    assert "processes.crash.per_year" in capsys.readouterr().err
