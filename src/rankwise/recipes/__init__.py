"""rankwise.recipes"""
