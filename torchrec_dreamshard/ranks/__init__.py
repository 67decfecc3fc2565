"""The ranks the package measures and plans on: spawned process groups, fresh-interpreter
ranks, the distributed job's own group, and torch's private names they need.
"""
