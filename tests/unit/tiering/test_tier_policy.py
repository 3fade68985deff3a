"""Tier policies: YAML in, every problem out, and the copy rules refused before anything runs."""

from __future__ import annotations

import pytest

from concord.errors import PolicyError
from concord.tiering.policy import TierPolicy, format_duration, load_policy, parse_duration


def good(tmp_path, **over) -> dict:
    doc = {
        "namespace": "run1",
        "hot": {"store": str(tmp_path / "hot"), "keep": 2, "rto": "1m"},
        "warm": {"store": "s3://warm-bucket/ckpt", "keep": 4, "storage_class": "STANDARD_IA"},
        "cold": {"store": "s3://cold-bucket/ckpt", "storage_class": "GLACIER", "rto": "12h"},
    }
    doc.update(over)
    return doc


def problems_of(doc) -> list[str]:
    with pytest.raises(PolicyError) as info:
        TierPolicy.from_dict(doc, source="test.yaml")
    assert "test.yaml" in str(info.value)
    return info.value.problems


def test_a_sound_policy_reads_back(tmp_path):
    p = TierPolicy.from_dict(good(tmp_path, rpo="2h", pin=["step-100"]))
    assert p.hot.keep == 2 and p.warm.keep == 4 and p.cold.keep is None
    assert p.cold.archive and p.cold.media_kind == "archive" and p.warm.media_kind == "object"
    assert p.hot.media_kind == "disk" and p.cold.is_offsite
    assert p.hot.rto_seconds == 60 and p.cold.rto_seconds == 12 * 3600 and p.rpo_for("warm") == 7200
    assert p.ref("step-5") == "run1/step-5"
    again = TierPolicy.from_dict(p.to_dict())
    assert again == p


def test_the_yaml_keys_of_the_issue_are_enough(tmp_path):
    f = tmp_path / "policy.yaml"
    f.write_text(
        f"hot: {{store: {tmp_path / 'hot'}, keep: 2}}\n"
        "warm: {store: s3://b1/warm, keep: 4}\n"
        "cold: {store: s3://b2/cold, storage_class: GLACIER}\n"
    )
    p = load_policy(str(f))
    assert p.namespace == "checkpoints" and p.cold.storage_class == "GLACIER"


def test_cold_keeps_everything(tmp_path):
    doc = good(tmp_path)
    doc["cold"]["keep"] = 3
    assert any("cold keeps every checkpoint" in p for p in problems_of(doc))


def test_warm_must_keep_what_hot_keeps(tmp_path):
    doc = good(tmp_path)
    doc["warm"]["keep"] = 1
    assert any("warm.keep (1) is less than hot.keep (2)" in p for p in problems_of(doc))


def test_two_kinds_of_media_and_off_site(tmp_path):
    doc = good(tmp_path)
    doc["warm"] = {"store": str(tmp_path / "warm"), "keep": 4}
    doc["cold"] = {"store": str(tmp_path / "cold")}
    found = problems_of(doc)
    assert any("same kind of media" in p for p in found)
    assert any("cold must be off-site" in p for p in found)
    # declared media and off-site make the same folders acceptable (a NAS and a tape library)
    doc["warm"]["media"] = "nas"
    doc["cold"].update(media="tape", offsite=True)
    assert TierPolicy.from_dict(doc).cold.is_offsite


def test_three_distinct_stores(tmp_path):
    doc = good(tmp_path)
    doc["cold"]["store"] = "s3://warm-bucket/ckpt/"
    assert any("same store" in p for p in problems_of(doc))


def test_archive_classes_only_in_cold(tmp_path):
    doc = good(tmp_path)
    doc["warm"]["storage_class"] = "DEEP_ARCHIVE"
    assert any("archive class" in p for p in problems_of(doc))


def test_every_problem_at_once_and_unknown_keys(tmp_path):
    doc = good(tmp_path, colder={"store": "x"})
    doc["hot"]["keep"] = 0
    doc["hot"]["kep"] = 1
    doc["warm"]["storage_class"] = "SHINY"
    doc["restore"] = {"tier": "Instant"}
    found = problems_of(doc)
    assert any("unknown key colder" in p for p in found)
    assert any("unknown key hot.kep" in p for p in found)
    assert any("hot.keep must be a whole number of 1 or more" in p for p in found)
    assert any("'SHINY' is not an S3 storage class" in p for p in found)
    assert any("restore.tier 'Instant'" in p for p in found)


def test_hot_and_warm_need_a_retention_in_the_same_unit(tmp_path):
    doc = good(tmp_path)
    del doc["hot"]["keep"]
    assert any("hot needs keep" in p for p in problems_of(doc))
    doc = good(tmp_path)
    doc["warm"] = {"store": "s3://warm-bucket/ckpt", "keep_days": 30}
    assert any("same unit" in p for p in problems_of(doc))


def test_storage_class_on_a_folder_is_refused(tmp_path):
    doc = good(tmp_path)
    doc["hot"]["storage_class"] = "STANDARD"
    assert any("applies only to s3:// stores" in p for p in problems_of(doc))


def test_missing_and_broken_files(tmp_path):
    with pytest.raises(PolicyError, match="no such policy file"):
        load_policy(str(tmp_path / "nope.yaml"))
    bad = tmp_path / "bad.yaml"
    bad.write_text("hot: [unclosed\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(str(bad))
    with pytest.raises(PolicyError, match="must be a mapping"):
        TierPolicy.from_dict(["hot"])


@pytest.mark.parametrize("text,seconds", [("90", 90), (90, 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("7d", 604800), ("1.5h", 5400), ("250ms", 0.25)])
def test_durations(text, seconds):
    assert parse_duration(text, "x") == seconds


@pytest.mark.parametrize("text", ["soon", "-5s", "5 parsecs", True])
def test_bad_durations(text):
    with pytest.raises(ValueError, match="x"):
        parse_duration(text, "x")


def test_format_duration():
    assert [format_duration(s) for s in (60, 7200, 86400, 90, 0.5, None)] == ["1m", "2h", "1d", "90s", "0.5s", "-"]


def test_folders_in_a_policy_file_are_relative_to_the_file(tmp_path, monkeypatch):
    (tmp_path / "conf").mkdir()
    f = tmp_path / "conf" / "policy.yaml"
    f.write_text("hot: {store: ../hot, keep: 1}\nwarm: {store: s3://b1/warm, keep: 1}\ncold: {store: s3://b2/cold}\n")
    monkeypatch.chdir("/")
    assert load_policy(str(f)).hot.store == str(tmp_path / "hot")


def test_a_missing_tier_is_reported_without_follow_on_noise(tmp_path):
    found = problems_of({"hot": {"store": str(tmp_path / "hot"), "keep": 1}})
    assert found == ["warm is required (at least {store: ...})", "cold is required (at least {store: ...})"]


def test_a_store_address_of_no_store_is_a_problem_and_the_copy_rules_wait(tmp_path):
    doc = good(tmp_path)
    doc["warm"]["store"] = "s3://"
    doc["cold"]["store"] = "file://elsewhere/cold"
    found = problems_of(doc)
    assert "warm.store 's3://' is not a store: no bucket name after s3://" in found
    assert any(p.startswith("cold.store 'file://elsewhere/cold' is not a store: file:// URIs") for p in found)
    assert not any("same kind of media" in p or "off-site" in p for p in found)


def test_one_store_spelled_two_ways_is_one_store(tmp_path):
    doc = good(tmp_path)
    doc["warm"] = {"store": "file://" + str(tmp_path / "my hot").replace(" ", "%20"), "keep": 4}
    doc["hot"]["store"] = str(tmp_path / "my hot") + "/"
    assert any("warm and hot are the same store" in p for p in problems_of(doc))


def test_the_kind_of_a_store_is_read_before_s3s_rules_apply(tmp_path):
    p = TierPolicy.from_dict(good(tmp_path, cold={"store": "s3://b1/cold", "storage_class": "GLACIER"}))
    assert p.cold.media_kind == "archive" and p.cold.is_offsite and p.cold.address.bucket == "b1"
    with pytest.raises(ValueError, match="bucket names are 3 to 63"):
        p.cold.open()  # S3's bucket rules, when the store is opened
