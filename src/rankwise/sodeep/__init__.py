"""rankwise.sodeep"""
