"""The sharding-type choice: which type each table takes, by predicted step cost beyond a margin."""
