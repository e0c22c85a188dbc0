"""SWIM + Lifeguard membership (DESIGN.md "Membership").

``state`` is the protocol as a pure state machine (no IO, no clock);
``service.Membership`` drives it with a clock and the asyncio ``transport``;
``codec`` is the wire format and the trust boundary; ``simulator`` runs many
members in virtual time. The node reads the view with
``Membership.members()`` and places the members that are ALIVE and
``answered``: anyone can gossip an Alive, only a member that acked a probe
of this node's own is known to be there.
"""
