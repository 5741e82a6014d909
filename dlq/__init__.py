"""Dead letters: deliveries Kurir stopped trying, kept searchable and resendable (SPEC §2, §7)."""
