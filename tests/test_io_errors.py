"""fastload.io.errors: the one conversion of backend failures into fastload errors."""

import pytest

from fastload.errors import ConfigError, ObjectNotFoundError, StorageError
from fastload.io.errors import describe, storage_error, storage_errors


class _BackendError(Exception):
    """A backend's own exception type that is not an OSError (like botocore's)."""


def test_a_missing_object_becomes_object_not_found_naming_the_url(tmp_path):
    missing = tmp_path / "nope.jpg"
    with pytest.raises(ObjectNotFoundError, match="cannot read .*nope.jpg: it does not exist") as info:
        with storage_errors("read", str(missing)):
            missing.read_bytes()
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_a_foreign_exception_becomes_a_storage_error_with_its_type_and_cause():
    with pytest.raises(StorageError, match=r"cannot list s3://b/k: _BackendError: endpoint down") as info:
        with storage_errors("list", "s3://b/k"):
            raise _BackendError("endpoint down")
    assert isinstance(info.value.__cause__, _BackendError)
    assert not isinstance(info.value, ObjectNotFoundError)


def test_fastload_errors_pass_through_unchanged():
    original = ConfigError("bad option")
    with pytest.raises(ConfigError) as info:
        with storage_errors("read", "s3://b/k"):
            raise original
    assert info.value is original
    assert storage_error(original, "read", "x") is original


def test_describe_keeps_os_error_text_and_names_other_types():
    assert describe(PermissionError(13, "Permission denied")) == "[Errno 13] Permission denied"
    assert describe(_BackendError()) == "_BackendError: _BackendError()"
