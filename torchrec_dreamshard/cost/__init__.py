"""What a placement costs, predicted: table physics, the cost network and its fitting,
collectives on the hosts' topology, per-type table costs and whole-plan costs.
"""
