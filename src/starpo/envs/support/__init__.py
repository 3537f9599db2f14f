"""Customer support: resolve a customer's request within a written policy, with tool calls.
`cases`: the policy, the seeded case generator and the gold resolution; `customer`: the
scripted customer; `solver`: the gold trajectory; `env`: the env (`SupportEnv`)."""

from starpo.envs.support.env import SupportEnv

__all__ = ["SupportEnv"]
