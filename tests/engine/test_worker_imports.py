"""The worker start-up fix (engine/worker_imports.py): same imports, no directory re-read unless the zip
changed."""

from __future__ import annotations

import sys
import zipfile
import zipimport

import pytest

from engine.worker_imports import StableZipImporter, install


def test_stable_importer_reads_again_only_when_the_archive_changes(tmp_path, monkeypatch):
    archive = tmp_path / "pkg.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("stable_zip_mod_a.py", "VALUE = 1\n")
    reads = []
    real = zipimport._read_directory
    monkeypatch.setattr(zipimport, "_read_directory", lambda path: reads.append(path) or real(path))
    importer = StableZipImporter(str(archive))
    assert importer.find_spec("stable_zip_mod_a") is not None
    reads.clear()
    for _ in range(5):
        importer.invalidate_caches()
    assert reads == []  # unchanged archive: nothing re-read (plain zipimporter re-reads 5 times on 3.11)
    with zipfile.ZipFile(archive, "a") as z:
        z.writestr("stable_zip_mod_b.py", "VALUE = 2\n")
    importer.invalidate_caches()
    assert len(reads) == 1 and importer.find_spec("stable_zip_mod_b") is not None


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12 made zipimporter invalidation lazy")
def test_install_swaps_zip_importers_on_the_path(tmp_path, monkeypatch):
    archive = tmp_path / "pkg2.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("stable_zip_mod_c.py", "VALUE = 3\n")
    monkeypatch.syspath_prepend(str(archive))
    monkeypatch.setitem(sys.path_importer_cache, str(archive), zipimport.zipimporter(str(archive)))
    assert install() >= 1
    assert type(sys.path_importer_cache[str(archive)]) is StableZipImporter
    import stable_zip_mod_c

    assert stable_zip_mod_c.VALUE == 3
