"""Python-worker start-up fix, applied when replab's executor code is first imported in a worker.

Spark's Python worker calls `importlib.invalidate_caches()` at the start of EVERY task (pyspark
`worker_util.setup_spark_files`), and the workers import pyspark and py4j from zip archives on their path
(`$SPARK_HOME/python/lib/pyspark.zip`, 3.5 MB). On Python 3.10 and 3.11, `zipimporter.invalidate_caches()`
re-reads the archive's whole central directory at once (CPython gh-103200, "up to 3500 % slower" with pyspark;
made lazy in 3.12, not backported): measured here, a fifth of the replay's Python worker time. This module gives
each zip importer on the path the 3.12 behaviour where it matters: the directory is read again only when the
archive file changed (its size or modification time), which is what invalidation is for.
"""

from __future__ import annotations

import os
import sys
import zipimport


class StableZipImporter(zipimport.zipimporter):
    """A zipimporter whose `invalidate_caches()` re-reads the archive only when the file changed."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._stamp = self._file_stamp()

    def _file_stamp(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.archive)
        except OSError:
            return None
        return st.st_mtime_ns, st.st_size

    def invalidate_caches(self) -> None:
        stamp = self._file_stamp()
        if stamp is None or stamp != self._stamp:
            self._stamp = stamp
            super().invalidate_caches()


def install() -> int:
    """Swap the plain zip importers of sys.path for stable ones (Python < 3.12 only); returns how many."""
    if sys.version_info >= (3, 12):
        return 0
    swapped = 0
    for path, importer in list(sys.path_importer_cache.items()):
        if type(importer) is zipimport.zipimporter:
            try:
                sys.path_importer_cache[path] = StableZipImporter(path)
                swapped += 1
            except zipimport.ZipImportError:
                continue
    return swapped
