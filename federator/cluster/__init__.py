"""The cluster as every node and client sees it: the heartbeats in ``<APP>-nodes`` and the
view built from them (who is live, who hosts which partition). Below routing and below the
node, so both read it without importing each other."""
