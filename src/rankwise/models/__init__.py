"""rankwise.models"""
