"""Tokens of a tool env's prompt under each `rollout.tool_format`, side by side in one run.

    python bench/bench_tool_prompt.py [--seeds 32] [--envs invoice support]

Tokenizer only (the embedded SmolLM2-135M-Instruct's, whose chat template has no tool
support, so the system message lists the tools): for each env, with its CPU preset's
rollout settings (`cpu-<env>-sft-starpo-s`), it counts the system message's tokens, the
whole first prompt's (system message, task, case and format, as the rollout engine
builds them; mean over `--seeds` cases) and a whole gold dialogue's (the solver's episode
laid out as an SFT example, every turn's chunk and reply; mean over the same seeds), then
each against json's. No model runs: the counts are exact and the same on every machine.
"""

from __future__ import annotations

import argparse
import statistics

from starpo.config import load_config
from starpo.envs import make
from starpo.models import load_tokenizer
from starpo.rollout import prompts
from starpo.rollout.chat import ChatTokens
from starpo.sft.replay import replay_records
from starpo.sft.run import gather_records

FORMATS = tuple(prompts.TOOL_LISTINGS)  # json first: the ratios are against it


def first_prompt_tokens(tokenizer, settings, env_id: str, seed: int) -> tuple[int, int]:
    """(system message tokens, whole first prompt tokens) of `env_id`'s case `seed`, built
    with the functions the rollout engine uses (`RolloutEngine._observe` on turn 1)."""
    env = make(env_id)
    state, _ = env.reset(seed=seed)
    schemas = env.tool_schemas()
    chat = ChatTokens(tokenizer, prompts.tool_generation_prefix(settings.think), tools=schemas)
    system = prompts.tool_system_prompt(
        schemas, native=chat.native_tools, tool_format=settings.tool_format
    )
    user = prompts.tool_task_message(
        env,
        state,
        max_calls=settings.max_actions_per_turn,
        calls_left=settings.max_actions_per_traj,
        think=settings.think,
        max_response_words=settings.max_response_words,
        syntax=chat.call_syntax,
    )
    return len(chat.encode(system)), len(chat.first_prompt(system, user))


def measure(tokenizer, env_id: str, tool_format: str, seeds: int) -> dict[str, float]:
    """The three counts of one env and format (means over cases 0 .. seeds-1)."""
    cfg = load_config(f"cpu-{env_id}-sft-starpo-s", [f"rollout.tool_format={tool_format}"])
    settings = cfg.rollout.settings()
    firsts = [first_prompt_tokens(tokenizer, settings, env_id, seed) for seed in range(seeds)]
    records = gather_records([], from_solver=seeds, env_id=env_id, seed_start=0).records
    examples = replay_records(records, tokenizer, settings).examples
    return {
        "system": firsts[0][0],  # the same for every case
        "first": statistics.mean(first for _, first in firsts),
        "dialogue": statistics.mean(len(example.token_ids) for example in examples),
        "examples": len(examples),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=32, help="cases measured (default 32)")
    parser.add_argument("--envs", nargs="+", default=["invoice", "support"])
    args = parser.parse_args()
    tokenizer = load_tokenizer()
    print(
        f"tokens with the embedded default model's tokenizer; first prompt and gold dialogue: "
        f"mean over cases 0-{args.seeds - 1}"
    )
    print(
        f"{'env':<8} {'format':<10} {'system':>7} {'first prompt':>12} {'gold dialogue':>13}  "
        "ratio to json: system / first / dialogue"
    )
    for env_id in args.envs:
        rows = {fmt: measure(tokenizer, env_id, fmt, args.seeds) for fmt in FORMATS}
        base = rows["json"]
        for fmt, row in rows.items():
            ratios = [row[key] / base[key] for key in ("system", "first", "dialogue")]
            print(
                f"{env_id:<8} {fmt:<10} {row['system']:>7} {row['first']:>12.1f} "
                f"{row['dialogue']:>13.1f}  {' / '.join(f'{r:.2f}' for r in ratios)}"
                + ("" if row["examples"] == args.seeds else f"  ({row['examples']} replayed)")
            )


if __name__ == "__main__":
    main()
