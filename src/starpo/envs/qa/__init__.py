"""QA: answer a question in free text, judged by the env. `env`: the env (`QAEnv`); `data`."""

from starpo.envs.qa.env import QAEnv

__all__ = ["QAEnv"]
