-- The demo consumers' own tables.
CREATE TABLE IF NOT EXISTS shop_member_points (
    member_id  text        PRIMARY KEY,
    points     bigint      NOT NULL,
    version    bigint      NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS shop_notifications (
    event_id   text        PRIMARY KEY,
    order_id   text        NOT NULL,
    member_id  text        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
