"""Accounts payable: approve, hold or reject an incoming invoice with tool calls, scored by
the final ledger. `env`: the env (`InvoiceEnv`); `cases`: the database, the seeded case
generator and the company's rules (the gold decision)."""

from starpo.envs.invoice.env import InvoiceEnv

__all__ = ["InvoiceEnv"]
