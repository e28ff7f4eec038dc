"""Every replication policy family, parameter and preset: the single source (SPEC §3).

A family is a frozen dataclass; each field is one parameter, declared once with its default, unit, allowed
values, meaning and source. The CLI (`replab policies`), the README table, MLflow params and the parser all
read these declarations. Presets live in `conf/policies.yaml` and are parsed with the same rules.

Policy strings: `FAMILY[:param=value,...]` or `PRESET[:param=value,...]` (SPEC §3). The canonical form is the
family followed by every parameter that differs from its default, in declaration order; two strings with the
same meaning have the same canonical form.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from typing import Any, ClassVar, get_type_hints

import yaml

import conf
from schemas.errors import BadInput


class Acks(enum.StrEnum):
    """Kafka producer `acks`."""

    ZERO = "0"
    ONE = "1"
    ALL = "all"


class Controller(enum.StrEnum):
    """Kafka metadata quorum; decides the broker session timeout."""

    KRAFT = "kraft"
    ZOOKEEPER = "zookeeper"


class Assignment(enum.StrEnum):
    """Kafka replica placement (SPEC §3.2)."""

    SEED = "seed"
    KAFKA = "kafka"


class FlushMode(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


class BrokerRole(enum.StrEnum):
    ASYNC_MASTER = "ASYNC_MASTER"
    SYNC_MASTER = "SYNC_MASTER"


class Reconcile(enum.StrEnum):
    MASTER_WINS = "master_wins"
    UNION = "union"


def param(default: Any, meaning: str, *, source: str = "", unit: str | None = None, minimum: int | None = None,
          maximum: int | None = None, nullable: bool = False, derived: str | None = None) -> Any:
    """Declare one policy parameter (a dataclass field with its documentation attached)."""
    return field(default=default, metadata={
        "meaning": meaning, "source": source, "unit": unit, "minimum": minimum, "maximum": maximum,
        "nullable": nullable, "derived": derived,
    })


@dataclass(frozen=True)
class ParamSpec:
    """A parameter as the CLI, docs and MLflow see it."""

    name: str
    type_name: str
    default: Any
    unit: str | None
    allowed: tuple[str, ...] | None
    minimum: int | None
    maximum: int | None
    nullable: bool
    derived: str | None
    meaning: str
    source: str

    @property
    def default_text(self) -> str:
        if self.default is None:
            return self.derived or "null"
        return format_value(self.default)


def format_value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


# ---------------------------------------------------------------------------------------------------------
# Fixed timings that are facts of the systems rather than knobs (sources in reference §A-B).
KRAFT_SESSION_TIMEOUT_MS = 9000  # broker.session.timeout.ms [K-KRaftConfigs]
ZK_SESSION_TIMEOUT_MS = 18000  # zookeeper.session.timeout.ms since 2.5 [K-ZkConfigs]
OS_WRITEBACK_EXPIRE_MS = 30000  # dirty_expire_interval [Linux-wb]
OS_WRITEBACK_PERIOD_MS = 5000  # dirty_writeback_interval [Linux-wb]
NAMESERVER_EXPIRY_MS = 120000  # DEFAULT_BROKER_CHANNEL_EXPIRED_TIME [R-RouteInfo]
CONTROLLER_FIRST_SCAN_MS = 2000  # first heartbeat scan after start [DefaultBrokerHeartbeatManager] (SPEC §3.7 C-1)
FIRST_SYNC_STATE_CHECK_MS = 3000  # first SyncStateSet check after start [ReplicasManager] (SPEC §3.7 C-1)


@dataclass(frozen=True)
class Policy:
    """Parameters common to every family (SPEC §3.1). Subclasses are the families."""

    family: ClassVar[str] = ""
    description: ClassVar[str] = ""

    partitions: int = param(12, "Kafka partitions of the topic; RocketMQ families use groups × queues_per_group",
                            source="SPEC §3.1", minimum=1, maximum=100000)
    flush: FlushMode = param(FlushMode.ASYNC, "`sync` (durable before ack) or `async`",
                             source="SPEC §3.1")
    flush_interval_ms: int | None = param(None, "async flush cadence: a message is durable on a broker at the "
                                          "first flush tick at or after it was written there", unit="ms",
                                          minimum=1, nullable=True, source="SPEC §3.1")
    delivery_timeout_ms: int = param(120000, "a client gives up on a message this long after its first send",
                                     unit="ms", minimum=1, source="SPEC §3.1")

    # -- introspection ------------------------------------------------------------------------------------
    @classmethod
    def param_specs(cls) -> tuple[ParamSpec, ...]:
        return _param_specs(cls)

    @classmethod
    def defaults(cls) -> Policy:
        return cls()

    def params(self) -> dict[str, Any]:
        """Every parameter with its value (enums as their strings): MLflow params, the `runs` table."""
        return {f.name: format_value(getattr(self, f.name)) for f in dataclasses.fields(self)}

    def canonical(self) -> str:
        """`family[:k=v,...]` listing the parameters that differ from the defaults, in declaration order."""
        base = type(self)()
        diffs = [f"{f.name}={format_value(getattr(self, f.name))}" for f in dataclasses.fields(self)
                 if getattr(self, f.name) != getattr(base, f.name)]
        return self.family + (":" + ",".join(diffs) if diffs else "")

    def __str__(self) -> str:
        return self.canonical()


@dataclass(frozen=True)
class KafkaPolicy(Policy):
    """Kafka ISR replication (SPEC §3.2)."""

    family: ClassVar[str] = "kafka"
    description: ClassVar[str] = "Apache Kafka ISR replication: acks, min.insync.replicas, clean/unclean " \
                                 "election, KRaft/ZooKeeper failover"

    # The common parameters again, with the Kafka config key or class each one stands for (SPEC §3.7).
    partitions: int = param(12, "partitions of the topic", source="`NewTopic` numPartitions (broker default "
                            "`num.partitions`)", minimum=1, maximum=100000)
    flush: FlushMode = param(FlushMode.ASYNC, "`sync` (durable before ack) or `async`",
                             source="`flush.messages` (TopicConfig; sync = 1)")
    flush_interval_ms: int | None = param(None, "async flush cadence: a message is durable on a broker at the "
                                          "first flush tick at or after it was written there; null = no Kafka "
                                          "fsync, the OS writes back pages older than 30000 ms every 5000 ms",
                                          unit="ms", minimum=1, nullable=True,
                                          source="`flush.ms` (TopicConfig); null: Linux "
                                          "vm.dirty_expire_centisecs / vm.dirty_writeback_centisecs")
    client_failover_ms: int = param(100, "time from a new leader being chosen to clients producing to it "
                                    "(metadata refresh; undocumented in Kafka)", unit="ms", minimum=0,
                                    source="`Metadata.requestUpdate` on NOT_LEADER_OR_FOLLOWER (`Sender`); "
                                    "delay undocumented, reference §A.6 ⚠")
    delivery_timeout_ms: int = param(120000, "a client gives up on a message this long after its first send",
                                     unit="ms", minimum=1, source="`delivery.timeout.ms` (ProducerConfig)")
    replication_factor: int = param(3, "replicas per partition", minimum=1, maximum=32,
                                    source="`NewTopic` replicationFactor (broker default "
                                    "`default.replication.factor`)")
    acks: Acks = param(Acks.ALL, "producer acks: `0`, `1` or `all`",
                       source="`acks` (ProducerConfig; all since 3.0, KIP-679)")
    min_insync_replicas: int = param(1, "acks=all is refused before append while the ISR size is below this; "
                                     "effective value is min(this, replication_factor)",
                                     source="`min.insync.replicas` (ServerLogConfigs); `Partition.effectiveMinIsr`",
                                     minimum=1, maximum=32)
    replica_lag_time_max_ms: int = param(30000, "a follower not caught up for longer leaves the ISR; checked "
                                         "every half of it", unit="ms", minimum=2,
                                         source="`replica.lag.time.max.ms` (ReplicationConfigs, 30000 since 2.5); "
                                         "`ReplicaManager` isr-expiration")
    controller: Controller = param(Controller.KRAFT, "`kraft` (broker.session.timeout.ms 9000) or `zookeeper` "
                                   "(zookeeper.session.timeout.ms 18000)",
                                   source="`broker.session.timeout.ms` (KRaftConfigs), `zookeeper.session.timeout.ms` "
                                   "(ZkConfigs)")
    unclean_leader_election: bool = param(False, "elect an out-of-sync replica when no ISR member is up",
                                          source="`unclean.leader.election.enable` (TopicConfig; false since 0.11, "
                                          "KIP-106)")
    eligible_leader_replicas: bool = param(False, "KIP-966 ELR: replicas that left the ISR below min ISR stay "
                                           "electable",
                                           source="`eligible.leader.replicas.version` feature (KIP-966, on for new 4.1 "
                                           "clusters); `PartitionChangeBuilder`")
    strict_min_isr: bool = param(True, "the high watermark does not advance while the ISR size is below the "
                                 "effective min_insync_replicas",
                                 source="`Partition.maybeIncrementLeaderHW` (KAFKA-15583, since 3.7)")
    request_timeout_ms: int = param(30000, "a produce request not acknowledged within this is retried",
                                    unit="ms", minimum=1, source="`request.timeout.ms` (ProducerConfig)")
    retry_backoff_ms: int = param(100, "a refused message (NotEnoughReplicas) is first tried again this long "
                                  "after its previous attempt; the n-th retry waits "
                                  "min(retry_backoff_max_ms, this × 2^(n−1)) (no jitter)", unit="ms", minimum=1,
                                  source="`retry.backoff.ms` (CommonClientConfigs); `RecordAccumulator`")
    retry_backoff_max_ms: int = param(1000, "the cap of the exponential retry backoff (KIP-580, producer 3.7+)",
                                      unit="ms", minimum=1,
                                      source="`retry.backoff.max.ms` (CommonClientConfigs, KIP-580); "
                                      "`RecordAccumulator`")
    metadata_max_age_ms: int = param(300000, "how long clients keep writing to an isolated leader that still "
                                     "answers", unit="ms", minimum=1,
                                     source="`metadata.max.age.ms` (ProducerConfig)")
    linger_ms: int = param(5, "a message waits this long in the client before its batch can be sent (SPEC §3.7 "
                           "K-6, K-7)", unit="ms", minimum=0,
                           source="`linger.ms` (ProducerConfig; 5 since 4.0, KIP-1030)")
    batch_size: int = param(16384, "the most bytes of one partition a produce request carries; the rest waits for "
                            "the partition's next request (SPEC §3.7 K-6)", unit="bytes", minimum=1,
                            source="`batch.size` (ProducerConfig)")
    max_in_flight_requests_per_connection: int = param(
        5, "requests a client may have outstanding on one broker connection: a request is made, with the messages "
        "waiting then, when one of these slots frees, and read by the broker once the requests before it are "
        "answered; with 1 the broker idles a round trip between two requests (SPEC §3.7 K-6)", minimum=1, maximum=5,
        source="`max.in.flight.requests.per.connection` (ProducerConfig; at most 5 with idempotence)")
    partitions_per_request: int | None = param(
        None, "partitions of one broker a produce request carries: null = all of them (the Java producer), 1 = "
        "librdkafka (confluent-kafka, the Go, .NET and C clients), whose idempotent producer fails fatally after an "
        "unclean election; a client property, not a Kafka config (SPEC §3.7 K-6, K-8)", minimum=1, nullable=True,
        source="Java `Sender.sendProduceRequests` (one request per broker); librdkafka "
        "`rd_kafka_broker_produce_toppar` (one partition per ProduceRequest, librdkafka issue #1700)")
    assignment: Assignment = param(Assignment.SEED, "`seed`: replica j of partition i on broker (i + j) mod N; "
                                   "`kafka`: AdminUtils round-robin with shift, start index 0",
                                   source="seed: SPEC §3.2; kafka: `AdminUtils.assignReplicasToBrokers` "
                                   "(rack-unaware)")

    @property
    def session_timeout_ms(self) -> int:
        return KRAFT_SESSION_TIMEOUT_MS if self.controller is Controller.KRAFT else ZK_SESSION_TIMEOUT_MS

    @property
    def effective_min_isr(self) -> int:
        return min(self.min_insync_replicas, self.replication_factor)

    @property
    def fatal_after_unclean_election(self) -> bool:
        """SPEC §3.7 K-8: the producer is idempotent (acks=all) and librdkafka's (partitions_per_request set), which
        fails fatally on the sequence gap an unclean election leaves; the Java producer bumps its epoch and
        retries, and no unclean election happens without unclean_leader_election."""
        return self.acks is Acks.ALL and self.unclean_leader_election and self.partitions_per_request is not None


@dataclass(frozen=True)
class RocketMQPolicy(Policy):
    """RocketMQ classic master/slave (SPEC §3.3)."""

    family: ClassVar[str] = "rocketmq"
    description: ClassVar[str] = "Apache RocketMQ master/slave: ASYNC/SYNC_MASTER, ASYNC/SYNC_FLUSH, " \
                                 "multi-master failover, ordered queues"

    flush: FlushMode = param(FlushMode.ASYNC, "`sync` (durable before ack) or `async`",
                             source="MessageStoreConfig.flushDiskType (ASYNC_FLUSH / SYNC_FLUSH)")
    flush_interval_ms: int | None = param(500, "flushIntervalCommitLog; flushes only when flush_least_bytes are "
                                          "dirty, and fully every flush_thorough_interval_ms", unit="ms",
                                          minimum=1, nullable=True, source="MessageStoreConfig.flushIntervalCommitLog")
    delivery_timeout_ms: int = param(3000, "sendMsgTimeout: the whole send, retries included",
                                     unit="ms", minimum=1, source="DefaultMQProducer.sendMsgTimeout")
    groups: int | None = param(None, "broker groups; group g = brokers g·(1+s) … g·(1+s)+s, the first is master",
                               minimum=1, nullable=True, derived="⌊N / (1 + slaves_per_master)⌋",
                               source="SPEC §3.3 (a group is one brokerName)")
    slaves_per_master: int = param(1, "slaves per broker group (2m-2s layout with 4 brokers)", minimum=0,
                                   maximum=8, source="BrokerConfig.brokerId (docs/en/Deployment.md 2m-2s)")
    queues_per_group: int = param(4, "queues per broker group (defaultTopicQueueNums)", minimum=1,
                                  source="BrokerConfig.defaultTopicQueueNums")
    broker_role: BrokerRole = param(BrokerRole.ASYNC_MASTER, "ASYNC_MASTER acks at the master's append; "
                                    "SYNC_MASTER waits for a slave (4.x semantics)",
                                    source="MessageStoreConfig.brokerRole")
    in_sync_replicas: int = param(2, "copies (master included) SYNC_MASTER waits for; RocketMQ 5's default 1 "
                                  "makes SYNC_MASTER asynchronous (the 5.x trap)", minimum=1,
                                  source="MessageStoreConfig.inSyncReplicas (RIP-34)")
    flush_least_bytes: int = param(16384, "async flush skips a tick with fewer dirty bytes "
                                   "(flushCommitLogLeastPages = 4 pages)", unit="bytes", minimum=0,
                                   source="MessageStoreConfig.flushCommitLogLeastPages")
    flush_thorough_interval_ms: int = param(10000, "full flush cadence (flushCommitLogThoroughInterval)",
                                            unit="ms", minimum=1,
                                            source="MessageStoreConfig.flushCommitLogThoroughInterval")
    slave_timeout_ms: int = param(3000, "SYNC_MASTER wait before FLUSH_SLAVE_TIMEOUT", unit="ms", minimum=1,
                                  source="MessageStoreConfig.slaveTimeout (CommitLog.handleHA; docs say 5 s ⚠)")
    slave_not_available: bool = param(True, "SYNC_MASTER answers SLAVE_NOT_AVAILABLE at once when too few slaves "
                                      "are usable (4.x); false: 5.x, which has no such check, waits "
                                      "slave_timeout_ms and answers FLUSH_SLAVE_TIMEOUT (SPEC §3.7 R-6)",
                                      source="4.x CommitLog.handleHA (HAService.isSlaveOK); 5.x "
                                      "GroupTransferService.doWaitTransfer")
    retry_times_when_send_failed: int = param(2, "extra attempts on other broker groups", minimum=0,
                                              maximum=16, source="DefaultMQProducer.retryTimesWhenSendFailed")
    ordered: bool = param(False, "MessageQueueSelector by key hash: one attempt, no failover",
                          source="SelectMessageQueueByHash, DefaultMQProducerImpl.sendSelectImpl")
    route_refresh_ms: int = param(30000, "producer route poll (pollNameServerInterval)", unit="ms", minimum=1,
                                  source="ClientConfig.pollNameServerInterval (MQClientInstance)")
    reconcile: Reconcile = param(Reconcile.MASTER_WINS, "after a master loses data its log is the truth "
                                 "(`master_wins`), or slave-only messages are kept (`union`)",
                                 source="SPEC §3.3 (undocumented in RocketMQ ⚠)")


@dataclass(frozen=True)
class DLedgerPolicy(Policy):
    """RocketMQ on DLedger (Raft) (SPEC §3.4)."""

    family: ClassVar[str] = "dledger"
    description: ClassVar[str] = "RocketMQ on DLedger (Raft): majority commit, automatic leader election"

    flush: FlushMode = param(FlushMode.ASYNC, "`sync` (durable before ack) or `async`",
                             source="MessageStoreConfig.flushDiskType; DLedgerMmapFileStore")
    flush_interval_ms: int | None = param(10, "DLedger flushFileInterval (acks come before fsync)", unit="ms",
                                          minimum=1, nullable=True,
                                          source="DLedgerConfig.flushFileInterval (DLedgerMmapFileStore)")
    delivery_timeout_ms: int = param(3000, "sendMsgTimeout: the whole send, retries included",
                                     unit="ms", minimum=1, source="DefaultMQProducer.sendMsgTimeout")
    group_size: int = param(3, "replicas per Raft group; groups = ⌊N / group_size⌋", minimum=1, maximum=9,
                            source="DLedgerConfig.peers (docs/en/dledger/deploy_guide.md)")
    queues_per_group: int = param(4, "queues per broker group", minimum=1, source="BrokerConfig.defaultTopicQueueNums")
    heartbeat_ms: int = param(2000, "leader heartbeat interval (heartBeatTimeIntervalMs)", unit="ms",
                              minimum=1, source="DLedgerConfig.heartBeatTimeIntervalMs")
    max_heartbeat_leak: int = param(3, "missed heartbeats before followers notice leader loss", minimum=1,
                                    source="DLedgerConfig.maxHeartBeatLeak")
    vote_delay_ms: int = param(650, "delay of the vote that elects, after the failed first vote (R-7) or a "
                               "majority's return (midpoint of the 300-1000 ms jitter; deterministic)", unit="ms",
                               minimum=0,
                               source="DLedgerLeaderElector (minVoteIntervalMs 300, maxVoteIntervalMs 1000)")
    vote_wait_ms: int = param(2500, "the failed first vote after leader loss, in the old term: its wait for the "
                              "lost leader's answer (2000 ms + the 0-1000 ms jitter's midpoint; SPEC §3.7 R-7)",
                              unit="ms", minimum=0,
                              source="DLedgerLeaderElector.maintainAsCandidate "
                                     "(voteLatch.await(2000 + random(maxVoteIntervalMs)))")
    max_wait_ack_ms: int = param(2500, "an entry not committed within this fails with "
                                 "IN_SYNC_REPLICAS_NOT_ENOUGH and is retried at another group", unit="ms",
                                 minimum=1, source="DLedgerConfig.maxWaitAckTimeMs")
    retry_times_when_send_failed: int = param(2, "extra attempts on other broker groups", minimum=0,
                                              maximum=16, source="DefaultMQProducer.retryTimesWhenSendFailed")
    route_refresh_ms: int = param(30000, "producer route poll (pollNameServerInterval)", unit="ms", minimum=1,
                                  source="ClientConfig.pollNameServerInterval (MQClientInstance)")


@dataclass(frozen=True)
class RocketMQControllerPolicy(Policy):
    """RocketMQ 5 controller mode, RIP-44 (SPEC §3.5)."""

    family: ClassVar[str] = "rocketmq-controller"
    description: ClassVar[str] = "RocketMQ 5 controller mode (RIP-44): SyncStateSet, automatic master election"

    flush: FlushMode = param(FlushMode.ASYNC, "`sync` (durable before ack) or `async`",
                             source="MessageStoreConfig.flushDiskType (ASYNC_FLUSH / SYNC_FLUSH)")
    flush_interval_ms: int | None = param(500, "flushIntervalCommitLog (see rocketmq)", unit="ms", minimum=1,
                                          nullable=True, source="MessageStoreConfig.flushIntervalCommitLog")
    delivery_timeout_ms: int = param(3000, "sendMsgTimeout: the whole send, retries included",
                                     unit="ms", minimum=1, source="DefaultMQProducer.sendMsgTimeout")
    groups: int | None = param(None, "broker groups; group g = brokers g·(1+s) … g·(1+s)+s", minimum=1,
                               nullable=True, derived="⌊N / (1 + slaves_per_master)⌋",
                               source="SPEC §3.3 (a group is one brokerName)")
    slaves_per_master: int = param(2, "slaves per broker group", minimum=0, maximum=8,
                                   source="docs/en/controller/deploy.md (RIP-44)")
    queues_per_group: int = param(4, "queues per broker group", minimum=1, source="BrokerConfig.defaultTopicQueueNums")
    flush_least_bytes: int = param(16384, "async flush skips a tick with fewer dirty bytes", unit="bytes",
                                   minimum=0, source="MessageStoreConfig.flushCommitLogLeastPages")
    flush_thorough_interval_ms: int = param(10000, "full flush cadence", unit="ms", minimum=1,
                                            source="MessageStoreConfig.flushCommitLogThoroughInterval")
    ha_max_time_slave_not_catchup_ms: int = param(15000, "a slave not caught up for longer leaves the "
                                                  "SyncStateSet", unit="ms", minimum=1,
                                                  source="MessageStoreConfig.haMaxTimeSlaveNotCatchup")
    check_sync_state_set_period_ms: int = param(5000, "SyncStateSet shrink check cadence (first check 3000 ms "
                                                "after start)", unit="ms", minimum=1,
                                                source="BrokerConfig.checkSyncStateSetPeriod (ReplicasManager)")
    ha_housekeeping_interval_ms: int = param(20000, "the master closes a slave's silent HA connection after this, "
                                             "and the slave leaves the SyncStateSet (SPEC §3.7 C-1)", unit="ms",
                                             minimum=1, source="MessageStoreConfig.haHousekeepingInterval; "
                                             "AutoSwitchHAService.removeConnection")
    in_sync_replicas: int = param(1, "replicas (master included) that must hold a message before the ack",
                                  minimum=1, source="MessageStoreConfig.inSyncReplicas")
    all_ack_in_sync_state_set: bool = param(False, "wait for the whole SyncStateSet (the analogue of acks=all)",
                                            source="MessageStoreConfig.allAckInSyncStateSet (GroupTransferService)")
    min_insync_replicas: int = param(1, "refused before append while |SyncStateSet| is below this",
                                     minimum=1,
                                     source="MessageStoreConfig.minInSyncReplicas (CommitLog.asyncPutMessage)")
    enable_elect_unclean_master: bool = param(False, "elect any replica (highest offset) when the SyncStateSet "
                                              "has none alive", source="ControllerConfig.enableElectUncleanMaster")
    slave_timeout_ms: int = param(3000, "the master's wait for in_sync_replicas / the SyncStateSet before "
                                  "FLUSH_SLAVE_TIMEOUT", unit="ms", minimum=1,
                                  source="MessageStoreConfig.slaveTimeout (CommitLog.handleHA)")
    controller_heartbeat_timeout_ms: int = param(10000, "a master that stops heartbeating is dead after this "
                                                 "(crash: noticed at once)", unit="ms", minimum=1,
                                                 source="BrokerConfig.controllerHeartBeatTimeoutMills "
                                                 "(DefaultBrokerHeartbeatManager)")
    controller_scan_ms: int = param(5000, "the controller checks heartbeats this often", unit="ms", minimum=1,
                                    source="ControllerConfig.scanNotActiveBrokerInterval "
                                           "(DefaultBrokerHeartbeatManager)")
    retry_times_when_send_failed: int = param(2, "extra attempts on other broker groups", minimum=0,
                                              maximum=16, source="DefaultMQProducer.retryTimesWhenSendFailed")
    route_refresh_ms: int = param(30000, "producer route poll (pollNameServerInterval)", unit="ms", minimum=1,
                                  source="ClientConfig.pollNameServerInterval (MQClientInstance)")


FAMILIES: dict[str, type[Policy]] = {
    cls.family: cls for cls in (KafkaPolicy, RocketMQPolicy, DLedgerPolicy, RocketMQControllerPolicy)
}


# ---------------------------------------------------------------------------------------------------------
@cache
def _param_specs(cls: type[Policy]) -> tuple[ParamSpec, ...]:
    hints = get_type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        typ = _base_type(hints[f.name])
        allowed = tuple(m.value for m in typ) if isinstance(typ, type) and issubclass(typ, enum.Enum) else None
        if typ is bool:
            allowed = ("true", "false")
        specs.append(ParamSpec(
            name=f.name, type_name="enum" if allowed and typ is not bool else typ.__name__, default=f.default,
            unit=f.metadata["unit"], allowed=allowed, minimum=f.metadata["minimum"],
            maximum=f.metadata["maximum"], nullable=f.metadata["nullable"], derived=f.metadata["derived"],
            meaning=f.metadata["meaning"], source=f.metadata["source"],
        ))
    return tuple(specs)


def _base_type(hint: Any) -> type:
    args = [a for a in getattr(hint, "__args__", ()) if a is not type(None)]
    return args[0] if args else hint


def _convert(cls: type[Policy], name: str, text: str, where: str) -> Any:
    spec = next((s for s in cls.param_specs() if s.name == name), None)
    if spec is None:
        valid = ", ".join(s.name for s in cls.param_specs())
        raise BadInput(f"{where}: unknown parameter '{name}' for family {cls.family} (valid: {valid})",
                       rule="policy-param")
    typ = _base_type(get_type_hints(cls)[name])
    if text.lower() in ("null", "none") and spec.nullable:
        return None
    if typ is bool:
        if text.lower() not in ("true", "false"):
            raise BadInput(f"{where}: {name} must be true or false, got '{text}'", rule="policy-value")
        return text.lower() == "true"
    if isinstance(typ, type) and issubclass(typ, enum.Enum):
        for member in typ:
            if member.value.lower() == text.lower():
                return member
        raise BadInput(f"{where}: {name} must be one of {', '.join(spec.allowed or ())}, got '{text}'",
                       rule="policy-value")
    if typ is int:
        if not re.fullmatch(r"[+-]?\d+", text):
            raise BadInput(f"{where}: {name} must be an integer, got '{text}'", rule="policy-value")
        value = int(text)
        if (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None and value >
                                                                    spec.maximum):
            hi = spec.maximum if spec.maximum is not None else "∞"
            raise BadInput(f"{where}: {name}={value} is out of range [{spec.minimum}, {hi}]",
                           rule="policy-value")
        return value
    raise AssertionError(f"unsupported parameter type {typ}")  # a declaration bug, not user input


@dataclass(frozen=True)
class Preset:
    name: str
    spec: str
    description: str


@cache
def presets() -> dict[str, Preset]:
    """Presets from conf/policies.yaml, each validated by parsing it."""
    raw = yaml.safe_load(conf.read_text("policies.yaml")) or {}
    out: dict[str, Preset] = {}
    for name, body in (raw.get("presets") or {}).items():
        if not isinstance(body, dict) or set(body) != {"policy", "description"}:
            raise BadInput(f"preset '{name}' needs exactly 'policy' and 'description'", file="conf/policies.yaml",
                           rule="preset")
        out[name] = Preset(name, body["policy"], body["description"])
    for preset in out.values():
        parse_policy(preset.spec, _allow_presets=False)
    return out


def parse_policy(text: str, *, _allow_presets: bool = True) -> Policy:
    """Parse `FAMILY[:k=v,...]` or `PRESET[:k=v,...]` into a typed policy; errors list the valid choices."""
    text = text.strip()
    head, _, tail = text.partition(":")
    head = head.strip()
    base_overrides: list[tuple[str, str]] = []
    if head in FAMILIES:
        cls = FAMILIES[head]
    elif _allow_presets and head in presets():
        base = parse_policy(presets()[head].spec, _allow_presets=False)
        cls = type(base)
        base_overrides = [(f.name, format_value(getattr(base, f.name))) for f in dataclasses.fields(base)
                          if getattr(base, f.name) != getattr(cls(), f.name)]
    else:
        names = sorted(FAMILIES) + (sorted(presets()) if _allow_presets else [])
        raise BadInput(f"policy '{text}': unknown family or preset '{head}' (valid: {', '.join(names)})",
                       rule="policy-family")
    values: dict[str, Any] = {}
    for name, value in base_overrides:
        values[name] = _convert(cls, name, value, f"policy '{text}'")
    seen: set[str] = set()
    for item in (p.strip() for p in tail.split(",")) if tail.strip() else ():
        if "=" not in item:
            raise BadInput(f"policy '{text}': expected param=value, got '{item}'", rule="policy-syntax")
        name, _, value = (s.strip() for s in item.partition("="))
        if name in seen:
            raise BadInput(f"policy '{text}': parameter '{name}' given twice", rule="policy-syntax")
        seen.add(name)
        values[name] = _convert(cls, name, value, f"policy '{text}'")
    policy = cls(**values)
    _check_consistency(policy, text)
    return policy


def _check_consistency(policy: Policy, text: str) -> None:
    if isinstance(policy, KafkaPolicy) and policy.flush is FlushMode.SYNC and policy.flush_interval_ms:
        raise BadInput(f"policy '{text}': flush=sync and flush_interval_ms cannot both be set",
                       rule="policy-value")


def all_presets() -> Iterator[tuple[Preset, Policy]]:
    for preset in presets().values():
        yield preset, parse_policy(preset.spec)


def run_id(trace_id: str, policy: Policy | str, replab_version: str) -> str:
    """Deterministic run id (SPEC §4.4): a hash of trace id, canonical policy and replab version."""
    canonical = policy.canonical() if isinstance(policy, Policy) else policy
    digest = hashlib.sha256(f"{trace_id}\x1f{canonical}\x1f{replab_version}".encode()).hexdigest()
    return digest[:24]
