"""Partner callbacks: verify what arrives, extract what matters, never regress resource state."""
