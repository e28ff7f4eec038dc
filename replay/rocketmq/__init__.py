"""The RocketMQ policy families `rocketmq`, `dledger` and `rocketmq-controller` (SPEC §3.3-3.5): replay unit = broker
group. Their routing, control plane, family, reference interpreters and kernels."""
