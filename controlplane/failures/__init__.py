"""The failure-pattern knowledge base: published failure kinds with their precursors, rates and prevention
actions (``workers.reliability.risk.patterns``), extended by the incident lists a team imports."""
