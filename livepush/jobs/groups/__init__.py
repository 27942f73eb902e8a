"""Task groups: building them, counting their members, their progress and ctx.group."""
