"""apt_keyring's checks over real `gpg --show-keys --with-colons` output (captured from a key
generated for this test: tests/unit/fixtures/gpg)."""

from pathlib import Path

import pytest
from ansible_collections.hostnet.llamafactory.plugins.module_utils._keyring import (
    KeyringError,
    check,
    is_armored,
    normalize,
    primary_fingerprints,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
COLONS = (FIXTURES / "gpg" / "show-keys-with-subkey.txt").read_text()
PRIMARY = "04D41858AFFF4EC359C7602C163C9CCD10FF5A56"
SUBKEY = "9C059F446B42CDFAA678B78C3CE135744270294D"


def test_only_primary_fingerprints_count():
    assert primary_fingerprints(COLONS) == [PRIMARY]


def test_pinned_fingerprint_with_spaces_and_lower_case_matches():
    check([PRIMARY], ["04d4 1858 afff 4ec3 59c7  602c 163c 9ccd 10ff 5a56"], "url")
    assert normalize(" c95b 321b ") == "C95B321B"


@pytest.mark.parametrize(
    ("found", "wanted", "message"),
    [
        ([PRIMARY], [SUBKEY], "not the pinned " + SUBKEY),
        ([PRIMARY], ["C95B321B61E88C1809C4F759DDCAE044F796ECB0"], "refusing it"),
        ([], [PRIMARY], "holds no OpenPGP public key"),
    ],
)
def test_a_key_that_is_not_the_pinned_one_is_refused(found, wanted, message):
    with pytest.raises(KeyringError, match=message):
        check(found, wanted, "https://example.invalid/gpgkey")


def test_armor_detection():
    assert is_armored(b"\n-----BEGIN PGP PUBLIC KEY BLOCK-----\n...")
    assert not is_armored(b"\x99\x01\x8d\x04")
