"""`--replica URL` / `--replica name=URL`: names, checks, and no credentials kept."""

from __future__ import annotations

import pytest

from engine.errors import BadOption
from engine.fleet.replicas import MAX_REPLICAS, parse_replicas


def test_unnamed_replicas_are_lettered_in_order() -> None:
    fleet = parse_replicas(["http://127.0.0.1:8001", "127.0.0.1:8002/v1/"])
    assert fleet.names == ("a", "b")
    assert [r.url for r in fleet] == ["http://127.0.0.1:8001", "http://127.0.0.1:8002"]


def test_named_replicas_keep_their_names_and_letters_skip_them() -> None:
    fleet = parse_replicas(["b=http://127.0.0.1:8001", "http://127.0.0.1:8002", "gpu-3=h:9"])
    assert fleet.names == ("b", "a", "gpu-3")
    assert fleet.named("gpu-3") is not None
    assert str(fleet.named("b")) == "b=http://127.0.0.1:8001"


def test_an_unnamed_replica_never_takes_a_name_given_to_another() -> None:
    fleet = parse_replicas(["a=http://127.0.0.1:8001", "http://127.0.0.1:8002"])
    assert fleet.names == ("a", "b")


def test_letters_go_on_past_z() -> None:
    fleet = parse_replicas([f"http://127.0.0.1:{8000 + i}" for i in range(28)])
    assert fleet.names[25:] == ("z", "aa", "ab")


def test_credentials_become_a_header_and_never_stay_in_the_url() -> None:
    fleet = parse_replicas(["a=http://alice:s3cret@127.0.0.1:8001"])
    replica = fleet.named("a")
    assert replica is not None
    assert replica.url == "http://127.0.0.1:8001"
    assert replica.where.authorization is not None
    assert replica.where.authorization.startswith("Basic ")
    for shown in (str(replica), repr(replica), replica.url):
        assert "s3cret" not in shown and "alice" not in shown


def test_a_query_with_an_equals_sign_is_a_url_not_a_name() -> None:
    (replica,) = parse_replicas(["http://127.0.0.1:8001/?x=1"])
    assert replica.name == "a"


def test_lookup_by_url_takes_any_spelling_of_the_root() -> None:
    fleet = parse_replicas(["a=http://127.0.0.1:8001", "b=http://127.0.0.1:8002"])
    found = fleet.at("http://127.0.0.1:8002/v1")
    assert found is not None and found.name == "b"
    assert fleet.at("http://127.0.0.1:9999") is None
    assert fleet.at("not a url at all ::") is None


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ([], "no replica given"),
        (["a=http://h:1", "a=http://h:2"], "two replicas are named 'a'"),
        (["http://h:1", "b=http://h:1/"], "http://h:1 is given twice"),
        (["9x=http://h:1"], "'9x' is not a replica name"),
        (["a=ftp://h:1"], "ftp:// is not http:// or https://"),
        (["a=http://u:pw@h:0"], "port 0"),
        ([f"http://h:{i + 1}" for i in range(MAX_REPLICAS + 1)], "at most"),
    ],
)
def test_bad_replicas_are_refused_in_words(values: list[str], words: str) -> None:
    with pytest.raises(BadOption) as err:
        parse_replicas(values)
    assert err.value.option == "--replica"
    assert words in err.value.plain()
    assert "pw" not in err.value.plain()
