"""Stage runners, one module per stage of the data flow:

conversions -> fanout -> deliveries -> gate -> dispatch -> agent -> attempts/outcomes/dlq
"""
