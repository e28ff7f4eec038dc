"""Studies: questions answered by replaying, each a module runnable with `python -m studies.<name>`.

- `studies.dledger_vs_kafka`: which Kafka configuration matches a 5-broker DLedger cluster under one and two
  broker failures.
"""
