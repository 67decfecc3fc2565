"""The sharding-type choice: which type each table takes, chosen by predicted step cost
beyond a margin.
"""
