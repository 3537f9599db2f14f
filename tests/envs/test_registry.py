"""Registry: ids, make(), keyword checking, third-party entry points."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from starpo.envs import make, register, registered_ids, spec
from starpo.envs.bandit import BanditEnv
from starpo.errors import UserError

BUILTIN_IDS = {"bandit", "bandit-rev", "frozenlake", "sokoban", "sokoban-large", "sokoban-newvocab"}


def test_builtin_ids_are_registered_with_descriptions():
    assert BUILTIN_IDS <= set(registered_ids())
    for env_id in BUILTIN_IDS:
        assert spec(env_id).summary().strip()


def test_unknown_id_names_known_ids_and_closest_match():
    with pytest.raises(UserError) as err:
        make("sokobn")
    message = str(err.value)
    assert "'sokoban'" in message and "did you mean" in message
    assert "frozenlake" in message and "\n" not in message


def test_wrong_keyword_names_argument_and_accepted_ones():
    with pytest.raises(UserError) as err:
        make("frozenlake", sise=6)
    message = str(err.value)
    assert "'sise'" in message and "size" in message and "p_frozen" in message


def test_make_merges_spec_kwargs_with_overrides():
    env = make("bandit-rev", high_risk_prob=0.5)
    assert set(env.action_names) == {"Trader", "Librarian"}
    assert env.high_risk_prob == 0.5
    assert env.spec.id == "bandit-rev"


def test_register_callable_and_refuse_silent_overwrite():
    register("test-bandit-callable", BanditEnv, kwargs={"high_risk_name": "Tiger"})
    assert "Tiger" in make("test-bandit-callable").action_names
    with pytest.raises(UserError, match="already registered"):
        register("test-bandit-callable", BanditEnv)
    register("test-bandit-callable", BanditEnv, overwrite=True)
    assert "Dragon" in make("test-bandit-callable").action_names


def test_bad_entry_point_module_is_a_user_error():
    register("test-missing-module", "no_such_module_xyz:Env", overwrite=True)
    with pytest.raises(UserError, match="cannot load"):
        make("test-missing-module")


def test_third_party_entry_point_is_discovered(tmp_path: Path):
    """A package declaring `starpo.envs` entry points gets its env registered by id."""
    (tmp_path / "thirdparty_envs.py").write_text(
        textwrap.dedent("""
        from starpo.envs.bandit import BanditEnv

        class CoinEnv(BanditEnv):
            description = "a third-party coin env"

            def __init__(self):
                super().__init__(low_risk_name="Heads", high_risk_name="Tails")
    """)
    )
    dist = tmp_path / "thirdparty_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: thirdparty-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[starpo.envs]\ncoin = thirdparty_envs:CoinEnv\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from starpo.envs import make, registered_ids, check_env, spec
        assert "coin" in registered_ids(), registered_ids()
        env = make("coin")
        assert set(env.action_names) == {{"Heads", "Tails"}}
        assert spec("coin").summary() == "a third-party coin env"
        check_env(env)
        print("third-party ok")
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "third-party ok" in result.stdout
