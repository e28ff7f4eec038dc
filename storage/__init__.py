"""Storage: the Spark session, the lakehouse (the one Delta writer), the trace loader, the report queries."""

from schemas.exports import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "get_spark": "storage.session",
    "delta_package": "storage.session",
    "jars_dir": "storage.session",
    "cached_jars": "storage.session",
    "Lakehouse": "storage.lakehouse",
    "RunRecord": "storage.lakehouse",
    "RunsTransaction": "storage.lakehouse",
    "in_predicate": "storage.lakehouse",
    "with_retries": "storage.lakehouse",
    "locate": "storage.trace_loader",
    "read_events_arrow": "storage.trace_loader",
    "read_events_spark": "storage.trace_loader",
    "window_series": "storage.report_data",
    "latency_quantiles": "storage.report_data",
    "busiest_partitions": "storage.report_data",
    "partition_history": "storage.report_data",
    "report_paths": "storage.report_data",
}
__all__ = sorted(_EXPORTS)
__getattr__ = lazy_exports("storage", _EXPORTS)
