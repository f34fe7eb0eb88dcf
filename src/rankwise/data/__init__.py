"""rankwise.data"""
