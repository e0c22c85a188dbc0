"""SWIM + Lifeguard membership (DESIGN.md "Membership").

Until the gossip layer lands, a node's view holds only itself; the node
package reads the view through :mod:`node.cluster`.
"""
