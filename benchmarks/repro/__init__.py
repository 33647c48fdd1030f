"""The reproduction report's parts: which archived runs stand for today's code, the papers'
claims and their verdicts."""
