"""Dead letters: deliveries Kurir stopped trying, kept searchable and resendable."""
