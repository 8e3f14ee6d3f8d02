"""Unknown config keys get "did you mean" from the schema's field names at their level (issue 52 item 2)."""

import pytest

from dockerlaunch.errors import ConfigError
from dockerlaunch.job.load import load_config, validate_config
from dockerlaunch.job.messages import suggest_field


@pytest.mark.parametrize("data, said", [
    ({"hots": ["a"]}, "hots: unknown field (did you mean `hosts`?"),  # no hosts left: the typo, not "no hosts"
    ({"hosts": ["a"], "imgae": "x"}, "imgae: unknown field (did you mean `image`?"),
    ({"hosts": [{"address": "a", "identity_fle": "k"}]}, "hosts[0].identity_fle: unknown field (did you mean "
                                                         "`identity_file`?"),
    ({"hosts": ["a"], "ssh": {"knwon_hosts": "k"}}, "ssh.knwon_hosts: unknown field (did you mean `known_hosts`?"),
    ({"hosts": ["a"], "container": {"mounts": [{"source": "/a", "target": "/b", "readonly": True}]}},
     "container.mounts[0].readonly: unknown field (did you mean `read_only`?"),
    ({"hosts": ["a"], "job": {"comand": "x"}}, "job.comand: unknown field (did you mean `command`?"),
])
def test_an_unknown_key_gets_the_closest_field_at_its_level(data, said):
    with pytest.raises(ConfigError) as e:
        validate_config(data, "c.yaml")
    assert str(e.value).startswith(f"c.yaml: {said}"), str(e.value)
    assert "\n" not in str(e.value)


def test_nothing_close_says_check_the_spelling_and_other_errors_keep_their_words():
    with pytest.raises(ConfigError) as e:
        validate_config({"hosts": ["a"], "zzzzz": 1, "job": {"master_port": "x"}})
    msg = str(e.value)
    assert "zzzzz: unknown field (check the spelling; `dockerlaunch schema` lists the fields)" in msg
    assert "job.master_port: Input should be a valid integer" in msg and "did you mean" not in msg


def test_suggestions_come_from_the_level_of_the_key():
    assert suggest_field(("prot",)) is None and suggest_field(("ssh", "prot")) == "port"  # ssh's, not the top's
    assert suggest_field(("Hosts",)) == "hosts"
    assert suggest_field(("container", "gpu")) == "gpus"
    assert suggest_field(("hosts", 3, "adress")) == "address"
    assert suggest_field(("nosuch", "x")) is None


def test_the_yaml_typo_of_the_issue_through_load_config(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("hots:\n  - 10.0.0.1\nimage: x\n")
    with pytest.raises(ConfigError, match=r"hots: unknown field \(did you mean `hosts`\?"):
        load_config(str(f))
