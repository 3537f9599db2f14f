"""Advantage estimators for StarPO: token-level GAE, GRPO, bi-level (turn/token) GAE, and
GiGPO (episode- plus step-level group credit, no critic).

Conventions: B sequences of T tokens, right-padded; `mask` (B, T) is 1 on agent-generated
tokens only. Prompt, observation and padding tokens are not time steps of the agent: the
recursions walk backwards over masked positions only and skip the rest, so a turn's last
token bootstraps from the first token of the next turn, across the observation in between.
Advantages are training targets, so every estimator runs under `torch.no_grad()`.

The estimators as the registry names them (inputs, knobs, `compute_advantages`) are in
`starpo.algorithms.estimators`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from starpo.stats import EQUAL_REWARD_TOLERANCE

__all__ = [
    "bi_level_gae",
    "constant_groups",
    "gae_advantages",
    "gigpo_advantages",
    "grpo_advantages",
    "group_normalise",
    "recurring_turn_share",
]


def _check_rewards_on_mask(token_rewards: Tensor, mask: Tensor) -> None:
    # A reward on a non-agent token would be silently dropped by the masked recursion:
    # that is a reward-placement bug upstream, so fail loudly instead.
    if bool(((token_rewards != 0) & ~mask).any()):
        raise ValueError(
            "token_rewards is non-zero on tokens outside the mask; rewards must sit on agent "
            "tokens (a turn's last generated token), see place_rewards"
        )


@torch.no_grad()
def gae_advantages(
    token_rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float
) -> tuple[Tensor, Tensor]:
    """Token-level GAE over the agent tokens of each sequence.

    For masked positions t, with t' the next masked position of the same sequence
    (V(t') = A(t') = 0 past the last one):
        delta_t = r_t + gamma * V(t') - V(t)
        A_t     = delta_t + gamma * lam * A(t')
        R_t     = A_t + V(t)
    Unmasked positions get A = R = 0. Rewards must be zero off the mask (ValueError).
    No whitening here: the caller whitens (see `compute_advantages`).
    """
    m = mask.bool()  # (B, T)
    _check_rewards_on_mask(token_rewards, m)
    advantages = torch.zeros_like(values)  # (B, T)
    next_value = values.new_zeros(values.shape[0])  # (B,) V of the next agent token
    next_adv = values.new_zeros(values.shape[0])  # (B,) A of the next agent token
    zero = values.new_zeros(())
    for t in reversed(range(values.shape[1])):
        m_t, v_t = m[:, t], values[:, t]  # (B,)
        adv_t = token_rewards[:, t] + gamma * next_value - v_t + gamma * lam * next_adv
        advantages[:, t] = torch.where(m_t, adv_t, zero)
        # Carry the bootstrap state past non-agent tokens unchanged.
        next_value = torch.where(m_t, v_t, next_value)
        next_adv = torch.where(m_t, adv_t, next_adv)
    returns = torch.where(m, advantages + values, zero)  # (B, T)
    return advantages, returns


def group_normalise(
    values: Tensor, group_ids: Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> Tensor:
    """(N,) values -> (x - mean_g) / (std_g + eps) within each group g of equal `group_ids`
    (norm_by_std=False: x - mean_g). std_g is the unbiased sample std (Bessel's correction,
    torch.std's default, as in RAGEN/verl). A group whose values are all equal up to float
    rounding (`constant_groups`), including a group of one, gets exactly 0 (not NaN and not
    a rounding residue divided by eps)."""
    _, inverse, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    n_groups = counts.numel()
    counts = counts.to(values.dtype)  # (G,)
    mean = values.new_zeros(n_groups).index_add_(0, inverse, values) / counts  # (G,)
    dev = values - mean[inverse]  # (N,)
    sum_sq = values.new_zeros(n_groups).index_add_(0, inverse, dev * dev)  # (G,)
    std = (sum_sq / (counts - 1).clamp(min=1)).sqrt()  # (G,)
    out = dev / (std[inverse] + eps) if norm_by_std else dev  # (N,)
    constant = constant_groups(values, inverse, n_groups)  # (G,)
    return torch.where(constant[inverse], values.new_zeros(()), out)


def constant_groups(values: Tensor, inverse: Tensor, n_groups: int) -> Tensor:
    """(G,) bool: whether group g's values are equal up to float rounding (max - min within
    `starpo.stats.EQUAL_REWARD_TOLERANCE` of the larger magnitude, at least 1): the tensor
    form of `starpo.stats.rewards_equal`. Not std == 0: a float mean of equal values can
    differ from them in the last bit, and returns computed two ways (GiGPO's step returns)
    differ by an ulp, which divided by std + eps would become an advantage of ~0.06."""
    gmax = values.new_full((n_groups,), -torch.inf).scatter_reduce(0, inverse, values, "amax")
    gmin = values.new_full((n_groups,), torch.inf).scatter_reduce(0, inverse, values, "amin")
    scale = torch.maximum(gmax.abs(), gmin.abs()).clamp(min=1.0)  # (G,)
    return (gmax - gmin) <= EQUAL_REWARD_TOLERANCE * scale


@torch.no_grad()
def grpo_advantages(
    scores: Tensor, group_ids: Tensor, mask: Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> Tensor:
    """GRPO: each trajectory's score normalised within its group, on all its agent tokens.

        A_i = (R_i - mean_g) / (std_g + eps)     (norm_by_std=False: A_i = R_i - mean_g)

    over the group g of trajectories sharing i's group id (same initial state); see
    `group_normalise` (unbiased std; a constant group or a group of one gets A = 0 exactly).
    Returns (B, T), zero off the mask.
    """
    adv = group_normalise(scores, group_ids, eps, norm_by_std)  # (B,)
    return torch.where(mask.bool(), adv[:, None], scores.new_zeros(()))  # (B, T)


def _turn_end_maps(turn_rewards: Tensor, turn_ends: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B, K) padded turns -> is_end (B, T) bool and end_reward (B, T), after validation."""
    batch, length = mask.shape
    valid = turn_ends >= 0  # (B, K)
    if bool((valid[:, 1:] & ~valid[:, :-1]).any()):
        raise ValueError("turn_ends must be -1-padded at the end of each row only")
    if bool((turn_ends >= length).any()):
        raise ValueError(f"turn_ends hold positions >= T={length}")
    pairs = valid[:, 1:] & valid[:, :-1]
    if bool((pairs & (turn_ends[:, 1:] <= turn_ends[:, :-1])).any()):
        raise ValueError("turn_ends must be strictly increasing within each sequence")
    # Padding entries are scattered into a spare column T, then dropped.
    index = torch.where(valid, turn_ends, length)  # (B, K)
    is_end = torch.zeros(batch, length + 1, dtype=torch.bool, device=mask.device)
    is_end = is_end.scatter(1, index, valid)[:, :length]  # (B, T)
    rewards = torch.where(valid, turn_rewards, turn_rewards.new_zeros(()))
    end_reward = turn_rewards.new_zeros(batch, length + 1).scatter(1, index, rewards)[:, :length]
    if bool((is_end & ~mask).any()):
        raise ValueError("every turn end must be an agent token (mask = 1 there)")
    # A leading -1 column keeps amax defined for K = 0 and rows without turns.
    padded = torch.cat([turn_ends.new_full((batch, 1), -1), torch.where(valid, turn_ends, -1)], 1)
    last_end = padded.amax(dim=1)  # (B,)
    positions = torch.arange(length, device=mask.device)
    if bool((mask & (positions[None, :] > last_end[:, None])).any()):
        raise ValueError("agent tokens after the last turn end belong to no turn")
    return is_end, end_reward


@torch.no_grad()
def bi_level_gae(
    turn_rewards: Tensor,
    turn_ends: Tensor,
    values: Tensor,
    mask: Tensor,
    gamma_turn: float = 0.95,
    lam_turn: float = 1.0,
    gamma_token: float = 1.0,
    lam_token: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Bi-level GAE: turn-level GAE across turn ends, token-level GAE inside each turn.

    Let p_1 < ... < p_K be the last agent token of each turn (`turn_ends`, (B, K), -1
    padded) and r_k the turn rewards (`turn_rewards`, (B, K)). Turn level (V(p_{K+1}) = 0):
        delta_k  = r_k + gamma_turn * V(p_{k+1}) - V(p_k)
        A(p_k)   = delta_k + gamma_turn * lam_turn * A(p_{k+1})
    Token level, for agent tokens t of turn k before p_k, t' the next agent token in the
    turn (the turn's tokens are the masked ones in (p_{k-1}, p_k]), with A(p_k) as boundary:
        delta_t  = gamma_token * V(t') - V(t)
        A(t)     = delta_t + gamma_token * lam_token * A(t')
    Returns (A, R = A + V), both zero off the mask.
    """
    m = mask.bool()  # (B, T)
    is_end, end_reward = _turn_end_maps(turn_rewards, turn_ends, m)  # (B, T), (B, T)
    advantages = torch.zeros_like(values)  # (B, T)
    next_turn_value = values.new_zeros(values.shape[0])  # (B,) V(p_{k+1})
    next_turn_adv = values.new_zeros(values.shape[0])  # (B,) A(p_{k+1})
    next_tok_value = values.new_zeros(values.shape[0])  # (B,) V(t'), reset at each turn end
    next_tok_adv = values.new_zeros(values.shape[0])  # (B,) A(t')
    zero = values.new_zeros(())
    for t in reversed(range(values.shape[1])):
        v_t, m_t, end_t = values[:, t], m[:, t], is_end[:, t]  # (B,)
        turn_adv = (
            end_reward[:, t]
            + gamma_turn * next_turn_value
            - v_t
            + gamma_turn * lam_turn * next_turn_adv
        )
        tok_adv = gamma_token * next_tok_value - v_t + gamma_token * lam_token * next_tok_adv
        adv_t = torch.where(end_t, turn_adv, tok_adv)
        advantages[:, t] = torch.where(m_t, adv_t, zero)
        next_turn_value = torch.where(end_t, v_t, next_turn_value)
        next_turn_adv = torch.where(end_t, adv_t, next_turn_adv)
        next_tok_value = torch.where(m_t, v_t, next_tok_value)
        next_tok_adv = torch.where(m_t, adv_t, next_tok_adv)
    returns = torch.where(m, advantages + values, zero)  # (B, T)
    return advantages, returns


def discounted_turn_returns(turn_rewards: Tensor, turn_ends: Tensor, gamma: float) -> Tensor:
    """Each turn's discounted return from there to the episode's end, (B, K):

    G_k = r_k + gamma * G_{k+1}     (G = 0 past the last turn; 0 on -1-padded turns)
    """
    valid = turn_ends >= 0  # (B, K); padding only at the end of a row
    returns = torch.zeros_like(turn_rewards)  # (B, K)
    running = turn_rewards.new_zeros(turn_rewards.shape[0])  # (B,) G_{k+1}
    zero = turn_rewards.new_zeros(())
    for k in reversed(range(turn_rewards.shape[1])):
        running = torch.where(valid[:, k], turn_rewards[:, k] + gamma * running, zero)
        returns[:, k] = running
    return returns


def anchor_ids(group_ids: Tensor, turn_states: Tensor, valid: Tensor) -> Tensor:
    """One id per valid turn (row-major over `valid`, (N,)): turns of the same env group that
    start from the same env state (`turn_states`, (B, K) ids) share an id. A turn whose state
    is unknown (id < 0) is an anchor group of its own."""
    groups = group_ids[:, None].expand_as(turn_states)[valid]  # (N,)
    states = turn_states[valid]  # (N,)
    unique_negative = -1 - torch.arange(states.numel(), device=states.device)
    states = torch.where(states < 0, unique_negative, states)
    _, ids = torch.unique(torch.stack([groups, states], dim=1), dim=0, return_inverse=True)
    return ids


def spread_over_turns(turn_values: Tensor, turn_ends: Tensor, mask: Tensor) -> Tensor:
    """(B, K) per-turn values -> (B, T): each agent token gets its turn's value, where turn k
    covers the agent tokens in (p_{k-1}, p_k]; zero off the mask."""
    is_end, _ = _turn_end_maps(torch.zeros_like(turn_values), turn_ends, mask.bool())
    ends = is_end.long()
    turn_index = (torch.cumsum(ends, dim=1) - ends).clamp(max=turn_values.shape[1] - 1)  # (B, T)
    spread = turn_values.gather(1, turn_index)  # (B, T)
    return torch.where(mask.bool(), spread, turn_values.new_zeros(()))


@torch.no_grad()
def gigpo_advantages(
    scores: Tensor,
    group_ids: Tensor,
    turn_rewards: Tensor,
    turn_ends: Tensor,
    turn_states: Tensor,
    mask: Tensor,
    gamma_step: float = 0.95,
    step_weight: float = 1.0,
    eps: float = 1e-6,
    norm_by_std: bool = True,
) -> Tensor:
    """GiGPO (Feng et al., arXiv 2505.10978): episode-level plus step-level group credit.

    Episode level, per trajectory i of env group g (as GRPO):
        A_E(i)   = (R_i - mean_g R) / (std_g R + eps)
    Step level: turn k of trajectory i starts from env state s_{i,k}; the turns of group g
    that start from the same state form an anchor group a = (g, s). With the turn's
    discounted return G_{i,k} = sum_{j >= k} gamma_step^(j-k) r_{i,j},
        A_S(i,k) = (G_{i,k} - mean_a G) / (std_a G + eps)
    Per turn, on that turn's agent tokens:
        A(i,k)   = A_E(i) + step_weight * A_S(i,k)
    norm_by_std=False centres both levels without dividing (the paper's mean-only variant).
    A constant or one-member group (episode or anchor) contributes exactly 0, as in
    `group_normalise`; so does a turn whose state is unknown (id -1).

    Shapes: scores, group_ids (B,); turn_rewards, turn_ends (-1-padded), turn_states (B, K)
    (long state ids, equal id = equal state); mask (B, T). Returns (B, T), zero off the mask.
    """
    valid = turn_ends >= 0  # (B, K)
    episode = group_normalise(scores, group_ids, eps, norm_by_std)  # (B,)
    returns = discounted_turn_returns(turn_rewards, turn_ends, gamma_step)  # (B, K)
    anchors = anchor_ids(group_ids, turn_states, valid)  # (N,)
    step = torch.zeros_like(turn_rewards)  # (B, K)
    step[valid] = group_normalise(returns[valid], anchors, eps, norm_by_std)
    per_turn = torch.where(valid, episode[:, None] + step_weight * step, step.new_zeros(()))
    return spread_over_turns(per_turn, turn_ends, mask)


def recurring_turn_share(group_ids: Tensor, turn_states: Tensor, turn_ends: Tensor) -> float:
    """The share of turns whose start state recurs in their env group (anchor groups of two
    or more): the turns GiGPO's step level can credit. 0 when there are no turns."""
    valid = turn_ends >= 0
    if not bool(valid.any()):
        return 0.0
    ids = anchor_ids(group_ids, turn_states, valid)
    _, inverse, counts = torch.unique(ids, return_inverse=True, return_counts=True)
    return int((counts[inverse] > 1).sum()) / ids.numel()
