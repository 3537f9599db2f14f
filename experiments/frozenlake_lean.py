"""Does a FrozenLake model lean to the map's good moves, and can a linear probe read the
good moves from its hidden state? One forward pass per map on each model's first turn.

    python experiments/frozenlake_lean.py smollm2-135m-instruct runs/fl-random-gpu-settings/sft \\
        runs/fl-solver-avx2/sft runs/fl-solver-avx2/rl-grpo/final --maps 300

`experiments/frozenlake_drift.py` found that each GRPO step of 64 episodes pulls hard on
a ready-made "this move leads closer to the goal around the holes" feature, and that a
format-only start's move drift is noise. So does a format-only start lack the feature,
where the solver-SFT start, which RL improved, has it? For the first turn of `--maps`
non-slippery maps (the rollout's own prompt: system message, task, turn 1 and the
`<answer>` prefix) this reads two things per model:

- **lean**: the probability the model puts on the good moves (its next token, renormalised
  over the four moves) against the share of the four that are good, the probability a
  map-blind uniform policy puts there, in points;
- **probe**: held-out AUC of one logistic regression per move on the hidden state at the
  last prompt position (a middle and the last layer), predicting "this move is good
  here", trained on two thirds of the maps and scored on the rest; 0.5 is chance, and the
  same probe on shuffled labels is printed as the control. A feature a probe reads is
  one an update can pull on without building it first.

Non-slippery maps only (good moves are cells, not distributions). The model loads in fp32.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from starpo.compute.forward import common_prefix_length
from starpo.envs.frozenlake.env import FrozenLakeEnv
from starpo.envs.frozenlake.solver import ACTIONS
from starpo.models import DEFAULT_MODEL
from starpo.models.compat import cache_argument
from starpo.models.embedded import ensure_default_model
from starpo.rollout import prompts
from starpo.rollout.chat import ChatTokens

MOVES = ACTIONS  # Left, Down, Right, Up


def first_turns(seeds: range, max_steps: int = 10) -> list[tuple[str, np.ndarray]]:
    """(first user message, good-move mask (4,)) for each map whose goal is in reach."""
    env = FrozenLakeEnv(is_slippery=False, max_steps=max_steps)
    turns = []
    for seed in seeds:
        state, _ = env.reset(seed=seed)
        good = env.good_actions()
        if not good:
            continue
        user = prompts.first_user_message(
            env,
            state,
            max_actions_per_turn=1,
            actions_left=max_steps,
            think=False,
            max_response_words=30,
        )
        turns.append((user, np.array([move in good for move in MOVES], dtype=float)))
    return turns


def read_model(path: str, users: list[str], layers: tuple[float, ...] = (0.5, 1.0)):
    """(move probabilities (N, 4) renormalised over the four moves' first tokens, hidden
    states {layer fraction: (N, H)} at the last prompt position). The prompts' shared
    prefix (system message and task, most of each prompt) is run once and its KV cache
    copied for each prompt's own tail."""
    import copy

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chat = ChatTokens(tokenizer, prompts.generation_prefix(think=False))
    move_ids = [tokenizer.encode(" " + move, add_special_tokens=False)[0] for move in MOVES]
    if len(set(move_ids)) < len(MOVES):  # the lean reads one token a move
        raise SystemExit(
            f"{path}: the four moves share a first token; the lean needs distinct ones"
        )
    picked = {f: round(f * model.config.num_hidden_layers) for f in layers}
    ids = [chat.first_prompt(prompts.SYSTEM_PROMPT, user) for user in users]
    lengths = torch.tensor([len(seq) for seq in ids])
    padded = torch.nn.utils.rnn.pad_sequence([torch.tensor(seq) for seq in ids], True, -1)
    shared = common_prefix_length(padded, lengths)  # the system message and task
    probs, hidden = [], {f: [] for f in layers}
    name = cache_argument(model)  # `cache` in transformers 5, `past_key_values` before
    with torch.inference_mode():
        prefix_cache = model(torch.tensor([ids[0][:shared]]), use_cache=True).get(name)
        for seq in ids:
            out = model(
                torch.tensor([seq[shared:]]),
                use_cache=True,
                output_hidden_states=True,
                **{name: copy.deepcopy(prefix_cache)},
            )
            probs.append(torch.softmax(out.logits[0, -1, move_ids].float(), dim=0).numpy())
            for f, index in picked.items():
                hidden[f].append(out.hidden_states[index][0, -1].float().numpy())
    return np.array(probs), {f: np.array(h) for f, h in hidden.items()}


def lean_points(probs: np.ndarray, good: np.ndarray) -> tuple[float, float]:
    """(mean, standard error) over maps of P(good moves) - share of good moves, in points:
    0 for a map-blind uniform policy."""
    per_map = 100 * ((probs * good).sum(1) - good.mean(1))
    return float(per_map.mean()), float(per_map.std(ddof=1) / np.sqrt(len(per_map)))


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(a positive outscores a negative), ties half: the rank form of the ROC area."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    wins = (pos[:, None] > neg[None, :]).mean() + 0.5 * (pos[:, None] == neg[None, :]).mean()
    return float(wins)


def probe_auc(features: np.ndarray, good: np.ndarray, l2: float = 1e-2, iters: int = 200) -> float:
    """Held-out AUC of one L2 logistic regression per move (first two thirds of the rows
    train, the rest test; features standardised on the training rows), averaged over moves."""
    split = 2 * len(features) // 3
    mean, std = features[:split].mean(0), features[:split].std(0) + 1e-6
    x = torch.tensor((features - mean) / std, dtype=torch.float64)
    aucs = []
    for move in range(good.shape[1]):
        y = torch.tensor(good[:, move], dtype=torch.float64)
        w = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
        b = torch.zeros((), dtype=torch.float64, requires_grad=True)
        opt = torch.optim.LBFGS([w, b], max_iter=iters, line_search_fn="strong_wolfe")

        def loss(opt=opt, w=w, b=b, y=y) -> torch.Tensor:
            opt.zero_grad()
            logits = x[:split] @ w + b
            value = torch.nn.functional.binary_cross_entropy_with_logits(logits, y[:split])
            value = value + l2 * (w * w).sum()
            value.backward()
            return value

        opt.step(loss)
        scores = (x[split:] @ w + b).detach().numpy()
        aucs.append(auc(scores, good[split:, move]))
    return float(np.nanmean(aucs))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "models", nargs="+", help=f"model folders (HF format), or {DEFAULT_MODEL} (untrained)"
    )
    parser.add_argument("--maps", type=int, default=300, help="first turns read (maps)")
    parser.add_argument("--seed-start", type=int, default=123, help="first map seed")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if args.maps < 30:
        parser.error("--maps must be >= 30: the probe holds out a third of them")
    args.models = [str(ensure_default_model()) if m == DEFAULT_MODEL else m for m in args.models]
    missing = [m for m in args.models if not (Path(m) / "config.json").is_file()]
    if missing:
        parser.error(f"no model (config.json) in {', '.join(missing)}: give HF model folders")
    torch.set_num_threads(args.threads)
    turns = first_turns(range(args.seed_start, args.seed_start + args.maps))
    users, good = [user for user, _ in turns], np.array([mask for _, mask in turns])
    shuffled = np.random.default_rng(0).permutation(good)  # labels of other maps
    print(
        f"{len(turns)} first turns (non-slippery FrozenLake 4x4, seeds from "
        f"{args.seed_start}); good moves {good.sum(1).mean():.2f} of 4 a turn; "
        f"torch {torch.backends.cpu.get_cpu_capability()}, fp32"
    )
    print(
        "| model | lean to good moves | probe AUC, middle layer | last layer | "
        "shuffled-label control (middle) |"
    )
    print("|---|---|---|---|---|")
    for path in args.models:
        probs, hidden = read_model(path, users)
        middle, last = hidden[0.5], hidden[1.0]
        lean, lean_se = lean_points(probs, good)
        print(
            f"| {path} | {lean:+.1f} points (SE {lean_se:.1f}) | "
            f"{probe_auc(middle, good):.3f} | {probe_auc(last, good):.3f} | "
            f"{probe_auc(middle, shuffled):.3f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
