"""A printed fix is the user's own invocation: the same --config, --hosts and --name, quoted for a shell."""

import shlex

from dockerlaunch.job.invocation import FIX, Invocation


def test_a_fix_carries_the_users_config_hosts_and_name():
    inv = Invocation(config="c.yaml", hosts=("172.30.10.11", "172.30.10.12"), name="ux2")
    assert inv.fix("logs", "--follow") == ("fix: dockerlaunch logs --follow --config c.yaml "
                                           "--hosts 172.30.10.11,172.30.10.12 --name ux2")
    assert inv.fix("push", "img:1", name=False) == ("fix: dockerlaunch push img:1 --config c.yaml "
                                                    "--hosts 172.30.10.11,172.30.10.12")
    # the default ./dockerlaunch.yaml: nothing to repeat
    assert Invocation().fix("down") == "fix: dockerlaunch down"


def test_what_the_user_typed_comes_back_as_one_word_each():
    inv = Invocation(config="my configs/c 1.yaml", name="a'b")
    words = shlex.split(inv.fix("down").removeprefix(FIX + " "))
    assert words == ["dockerlaunch", "down", "--config", "my configs/c 1.yaml", "--name", "a'b"]
