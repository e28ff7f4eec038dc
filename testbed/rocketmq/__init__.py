"""The RocketMQ testbed (SPEC §12): a real Apache RocketMQ cluster (NameServer, DLedger groups), the official Java
client as a small harness, and the recorder that turns what they did into a trace, beside the Kafka testbed in
`testbed/` whose comparison, trace and publishing code it shares."""
