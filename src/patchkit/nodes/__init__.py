"""Keeping nodes in step: an image copied to other engines, the nodes a verb reaches, and each
node's ledger of builds."""
