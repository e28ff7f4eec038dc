"""What the testbed's follower sampling costs the brokers (`python -m bench.testbed_sampling_bench [PHASE_S]`):
an idle 3-broker cluster with the testbed's two topics of 12 partitions, sampled every 50 ms per broker as the
recorder does, in phases: none, one urllib request per read (a new HTTP connection each time), one batched read
on a kept connection (`testbed.observe.Jolokia`), the same with the request metrics every second; the CPU share
of the brokers and of this process in each (`testbed.instruments.CpuMeter`). Root only (network namespaces)."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from testbed.cluster import JOLOKIA_PORT, BrokerSettings, KafkaCluster, broker_name
from testbed.instruments import BROKER_METRICS_MS, CpuMeter
from testbed.jars import ensure_jars
from testbed.observe import SAMPLE_MS, Jolokia, Sampler
from testbed.schedule import topic_of


def _urllib_read(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=0.5) as resp:
        json.loads(resp.read())


def phase(name: str, cluster: KafkaCluster, read, seconds: float) -> dict:
    meter = CpuMeter(cluster.node_of_pgid)
    stop = threading.Event()
    reads = [0]

    def loop(broker: int) -> None:
        client = Jolokia(cluster.address(broker_name(broker)), JOLOKIA_PORT)
        k = 0
        while not stop.is_set():
            start = time.monotonic()
            read(cluster, broker, client, k)
            reads[0] += 1
            k += 1
            stop.wait(max(0.0, SAMPLE_MS / 1000 - (time.monotonic() - start)))

    threads = [threading.Thread(target=loop, args=(b,), daemon=True) for b in cluster.brokers] if read else []
    meter.start()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    meter.stop()
    shares = meter.shares()
    brokers = sum(v for k, v in shares["cpu_share"].items() if k.startswith("broker"))
    return {"phase": name, "reads": reads[0], "brokers_cpu": round(brokers, 3),
            "recorder_cpu": shares["cpu_share"].get("python"), "load_1m": shares["load_1m"]}


def main(argv: list[str]) -> int:
    from confluent_kafka.admin import AdminClient, NewTopic

    seconds = float(argv[0]) if argv else 20.0
    every = BROKER_METRICS_MS // SAMPLE_MS
    jars = ensure_jars(log=print)
    workdir = Path(tempfile.gettempdir()) / "replab-testbed-sampling"
    with KafkaCluster(jars, [0, 1, 2], BrokerSettings(30000, 9000, False, 300), workdir, "bsamp") as cluster:
        cluster.wait_ready()
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
        for fut in admin.create_topics([NewTopic(topic_of(i), 12, 3) for i in range(2)]).values():
            fut.result()
        time.sleep(5)
        phases = [
            ("none", None),
            ("urllib, a new connection per read",
             lambda c, b, j, k: _urllib_read(c.jolokia_url(b), Sampler.REQUEST)),
            ("batched read on a kept connection", lambda c, b, j, k: j.post(Sampler.REQUEST)),
            ("the same with the request metrics every second",
             lambda c, b, j, k: j.post(Sampler.WITH_METRICS if k % every == 0 else Sampler.REQUEST)),
            ("none, again", None),
        ]
        for name, read in phases:
            print(json.dumps(phase(name, cluster, read, seconds)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
