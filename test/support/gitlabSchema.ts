/**
 * GitLab's own DDL for the tables Sweeper touches, written from GitLab's `db/structure.sql`
 * (gitlabhq/gitlabhq): the columns, types, defaults and check constraints GitLab has for them (the
 * wide tables cut to the columns that matter here plus a few neighbours, in GitLab's order), its
 * primary keys and the indexes GitLab really has on them, laid out the way pg_dump writes them: an
 * index on the partitioned parent `ON ONLY p_ci_builds`, one per partition, then ATTACH PARTITION.
 * Builds: `p_ci_builds` PARTITION BY LIST (partition_id) with `ci_builds` (100) and
 * `gitlab_partitions_dynamic.ci_builds_101`; or the older plain `ci_builds` (before GitLab 16).
 */
import { PgClient } from "@effect/sql-pg"
import { Effect } from "effect"
import {
  type DatabaseName,
  databaseOfTable,
  GITLAB_SCHEMAS,
  WRITE_LOCK_TRIGGER_PREFIX
} from "../../src/domain/Databases.ts"

const namespaces = [
  `CREATE TABLE namespaces (
    id bigint NOT NULL,
    name character varying NOT NULL,
    path character varying NOT NULL,
    owner_id bigint,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    type character varying DEFAULT 'User'::character varying NOT NULL,
    description character varying DEFAULT ''::character varying NOT NULL,
    avatar character varying,
    visibility_level integer DEFAULT 20 NOT NULL,
    parent_id bigint,
    traversal_ids bigint[] DEFAULT '{}'::bigint[] NOT NULL,
    organization_id bigint,
    CONSTRAINT check_2eae3bdf93 CHECK ((organization_id IS NOT NULL))
  )`,
  `CREATE SEQUENCE namespaces_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
  `ALTER SEQUENCE namespaces_id_seq OWNED BY namespaces.id`,
  `ALTER TABLE ONLY namespaces ALTER COLUMN id SET DEFAULT nextval('namespaces_id_seq'::regclass)`,
  `ALTER TABLE ONLY namespaces ADD CONSTRAINT namespaces_pkey PRIMARY KEY (id)`,
  `CREATE INDEX index_namespaces_on_parent_id_and_id ON namespaces USING btree (parent_id, id)`,
  `CREATE INDEX index_namespaces_on_type_and_id ON namespaces USING btree (type, id)`,
  `CREATE INDEX index_namespaces_on_traversal_ids ON namespaces USING gin (traversal_ids)`
]

const projects = [
  `CREATE TABLE projects (
    id bigint NOT NULL,
    name character varying,
    path character varying,
    description text,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    creator_id bigint,
    namespace_id bigint NOT NULL,
    last_activity_at timestamp without time zone,
    visibility_level integer DEFAULT 0 NOT NULL,
    archived boolean DEFAULT false NOT NULL,
    pending_delete boolean DEFAULT false,
    project_namespace_id bigint,
    hidden boolean DEFAULT false NOT NULL,
    organization_id bigint,
    CONSTRAINT check_1a6f946a8a CHECK ((organization_id IS NOT NULL)),
    CONSTRAINT check_fa75869cb1 CHECK ((project_namespace_id IS NOT NULL))
  )`,
  `CREATE SEQUENCE projects_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
  `ALTER SEQUENCE projects_id_seq OWNED BY projects.id`,
  `ALTER TABLE ONLY projects ALTER COLUMN id SET DEFAULT nextval('projects_id_seq'::regclass)`,
  `ALTER TABLE ONLY projects ADD CONSTRAINT projects_pkey PRIMARY KEY (id)`,
  `CREATE INDEX index_projects_on_namespace_id_and_id ON projects USING btree (namespace_id, id)`,
  `CREATE UNIQUE INDEX index_projects_on_project_namespace_id ON projects USING btree (project_namespace_id)`,
  `CREATE INDEX index_projects_on_creator_id_and_id ON projects USING btree (creator_id, id)`
]

const issues = [
  `CREATE TABLE issues (
    id bigint NOT NULL,
    title character varying,
    author_id bigint,
    project_id bigint,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    description text,
    milestone_id bigint,
    iid integer,
    updated_by_id bigint,
    weight integer,
    confidential boolean DEFAULT false NOT NULL,
    due_date date,
    lock_version integer DEFAULT 0,
    relative_position integer,
    closed_at timestamp with time zone,
    state_id smallint DEFAULT 1 NOT NULL,
    work_item_type_id bigint,
    namespace_id bigint,
    CONSTRAINT check_c33362cd43 CHECK ((namespace_id IS NOT NULL))
  )`,
  `CREATE SEQUENCE issues_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
  `ALTER SEQUENCE issues_id_seq OWNED BY issues.id`,
  `ALTER TABLE ONLY issues ALTER COLUMN id SET DEFAULT nextval('issues_id_seq'::regclass)`,
  `ALTER TABLE ONLY issues ADD CONSTRAINT issues_pkey PRIMARY KEY (id)`,
  `CREATE INDEX idx_issues_on_project_id_and_rel_position_and_id_and_state_id ON issues USING btree (project_id, relative_position, id, state_id)`,
  `CREATE UNIQUE INDEX index_issues_on_project_id_and_iid ON issues USING btree (project_id, iid)`,
  `CREATE INDEX index_issues_on_namespace_id ON issues USING btree (namespace_id)`
]

const exportJobs = [
  `CREATE TABLE project_export_jobs (
    id bigint NOT NULL,
    project_id bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    status smallint DEFAULT 0 NOT NULL,
    jid character varying(100) NOT NULL,
    user_id bigint,
    exported_by_admin boolean DEFAULT false
  )`,
  `CREATE SEQUENCE project_export_jobs_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
  `ALTER SEQUENCE project_export_jobs_id_seq OWNED BY project_export_jobs.id`,
  `ALTER TABLE ONLY project_export_jobs ALTER COLUMN id SET DEFAULT nextval('project_export_jobs_id_seq'::regclass)`,
  `ALTER TABLE ONLY project_export_jobs ADD CONSTRAINT project_export_jobs_pkey PRIMARY KEY (id)`,
  `CREATE INDEX index_project_export_jobs_on_jid ON project_export_jobs USING btree (jid)`,
  `CREATE INDEX index_project_export_jobs_on_project_id_and_jid ON project_export_jobs USING btree (project_id, jid)`,
  `CREATE INDEX index_project_export_jobs_on_project_id_and_status ON project_export_jobs USING btree (project_id, status)`,
  `CREATE INDEX index_project_export_jobs_on_status ON project_export_jobs USING btree (status)`,
  `CREATE INDEX index_project_export_jobs_on_updated_at_and_id ON project_export_jobs USING btree (updated_at, id)`,
  `CREATE INDEX index_project_export_jobs_on_user_id ON project_export_jobs USING btree (user_id)`,
  `ALTER TABLE ONLY project_export_jobs ADD CONSTRAINT fk_rails_c88d8db2e1 FOREIGN KEY (project_id) REFERENCES projects(id) ON DELETE CASCADE`,
  `CREATE TABLE project_relation_exports (
    id bigint NOT NULL,
    project_export_job_id bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    status smallint DEFAULT 0 NOT NULL,
    relation text NOT NULL,
    jid text,
    export_error text,
    project_id bigint,
    CONSTRAINT check_15e644d856 CHECK ((char_length(jid) <= 255)),
    CONSTRAINT check_4b5880b795 CHECK ((char_length(relation) <= 255)),
    CONSTRAINT check_dbd1cf73d0 CHECK ((char_length(export_error) <= 300))
  )`,
  `CREATE SEQUENCE project_relation_exports_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
  `ALTER SEQUENCE project_relation_exports_id_seq OWNED BY project_relation_exports.id`,
  `ALTER TABLE ONLY project_relation_exports ALTER COLUMN id SET DEFAULT nextval('project_relation_exports_id_seq'::regclass)`,
  `ALTER TABLE ONLY project_relation_exports ADD CONSTRAINT project_relation_exports_pkey PRIMARY KEY (id)`,
  `CREATE UNIQUE INDEX index_project_export_job_relation ON project_relation_exports USING btree (project_export_job_id, relation)`,
  `CREATE INDEX index_project_relation_exports_on_project_id ON project_relation_exports USING btree (project_id)`,
  `ALTER TABLE ONLY project_relation_exports ADD CONSTRAINT fk_rails_28e2bdb3b1 FOREIGN KEY (project_export_job_id) REFERENCES project_export_jobs(id) ON DELETE CASCADE`
]

/** p_ci_builds' columns in GitLab's order (`lock_version` and `project_id` guarded by checks). */
const buildColumns = `
    status character varying,
    finished_at timestamp without time zone,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    started_at timestamp without time zone,
    coverage double precision,
    name character varying,
    options text,
    allow_failure boolean DEFAULT false NOT NULL,
    stage character varying,
    stage_idx integer,
    tag boolean,
    ref character varying,
    type character varying,
    target_url character varying,
    description character varying,
    erased_at timestamp without time zone,
    artifacts_expire_at timestamp without time zone,
    environment character varying,
    "when" character varying,
    yaml_variables text,
    queued_at timestamp without time zone,
    lock_version integer DEFAULT 0,
    coverage_regex character varying,
    retried boolean,
    protected boolean,
    failure_reason integer,
    scheduled_at timestamp with time zone,
    token_encrypted character varying,
    resource_group_id bigint,
    waiting_for_resource_at timestamp with time zone,
    processed boolean,
    scheduling_type smallint,
    id bigint NOT NULL,
    stage_id bigint,
    partition_id bigint NOT NULL,
    auto_canceled_by_partition_id bigint,
    auto_canceled_by_id bigint,
    commit_id bigint,
    erased_by_id bigint,
    project_id bigint,
    runner_id bigint,
    trigger_request_id bigint,
    upstream_pipeline_id bigint,
    user_id bigint,
    execution_config_id bigint,
    upstream_pipeline_partition_id bigint,
    CONSTRAINT check_1e2fbd1b39 CHECK ((lock_version IS NOT NULL)),
    CONSTRAINT check_9aa9432137 CHECK ((project_id IS NOT NULL))`

/** GitLab's indexes on builds: [parent name, partition suffix, definition]. */
const buildIndexes: ReadonlyArray<readonly [string, string, string]> = [
  [
    "p_ci_builds_status_created_at_project_id_idx",
    "status_created_at_project_id_idx",
    "(status, created_at, project_id) WHERE ((type)::text = 'Ci::Build'::text)"
  ],
  ["p_ci_builds_commit_id_status_type_idx", "commit_id_status_type_idx", "(commit_id, status, type)"],
  ["p_ci_builds_runner_id_id_idx", "runner_id_id_idx", "(runner_id, id DESC)"],
  ["p_ci_builds_project_id_id_idx", "project_id_id_idx", "(project_id, id)"],
  ["p_ci_builds_updated_at_idx", "updated_at_idx", "(updated_at)"]
]

/**
 * GitLab's runner tables as `build.stuck?` reads them: the runner (type 1 instance, 2 group,
 * 3 project; `active`; `contacted_at`, online within two hours), and its project and group
 * assignments. Cut to those columns.
 */
const runners = [
  `CREATE TABLE ci_runners (
    id bigint NOT NULL,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    contacted_at timestamp without time zone,
    active boolean DEFAULT true NOT NULL,
    run_untagged boolean DEFAULT true NOT NULL,
    runner_type smallint NOT NULL,
    CONSTRAINT ci_runners_pkey PRIMARY KEY (id)
  )`,
  `CREATE TABLE ci_runner_projects (
    id bigint NOT NULL GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    runner_id bigint NOT NULL,
    project_id bigint NOT NULL
  )`,
  `CREATE INDEX index_ci_runner_projects_on_runner_id ON ci_runner_projects USING btree (runner_id)`,
  `CREATE TABLE ci_runner_namespaces (
    id bigint NOT NULL GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
    runner_id bigint NOT NULL,
    namespace_id bigint NOT NULL
  )`,
  `CREATE INDEX index_ci_runner_namespaces_on_runner_id ON ci_runner_namespaces USING btree (runner_id)`
]

/** p_ci_pipelines' columns in GitLab's order (db/structure.sql, gitlabhq 41946e65). */
const pipelineColumns = `
    ref character varying,
    sha character varying,
    before_sha character varying,
    created_at timestamp without time zone,
    updated_at timestamp without time zone,
    tag boolean DEFAULT false,
    yaml_errors text,
    committed_at timestamp without time zone,
    project_id bigint,
    status character varying,
    started_at timestamp without time zone,
    finished_at timestamp without time zone,
    duration integer,
    user_id bigint,
    lock_version integer DEFAULT 0,
    pipeline_schedule_id bigint,
    source integer,
    config_source integer,
    protected boolean,
    failure_reason integer,
    iid integer,
    merge_request_id bigint,
    source_sha bytea,
    target_sha bytea,
    external_pull_request_id bigint,
    ci_ref_id bigint,
    locked smallint DEFAULT 1 NOT NULL,
    partition_id bigint NOT NULL,
    id bigint NOT NULL,
    auto_canceled_by_id bigint,
    auto_canceled_by_partition_id bigint,
    trigger_id bigint,
    CONSTRAINT check_2ba2a044b9 CHECK ((project_id IS NOT NULL)),
    CONSTRAINT check_d7e99a025e CHECK ((lock_version IS NOT NULL))`

/**
 * GitLab's tables a build's transition touches beside it (db/structure.sql, gitlabhq 41946e65):
 * the runner queue (ci_pending_builds), running builds (ci_running_builds), runner sessions, and
 * resource groups with their resources, with their primary keys and GitLab's unique indexes.
 */
const transitionTables = [
  `CREATE TABLE ci_pending_builds (
    id bigint NOT NULL,
    build_id bigint NOT NULL,
    project_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    protected boolean DEFAULT false NOT NULL,
    instance_runners_enabled boolean DEFAULT false NOT NULL,
    namespace_id bigint,
    minutes_exceeded boolean DEFAULT false NOT NULL,
    tag_ids bigint[] DEFAULT '{}'::bigint[],
    namespace_traversal_ids bigint[] DEFAULT '{}'::bigint[],
    partition_id bigint NOT NULL,
    plan_id bigint,
    plan_name_uid smallint\n  )`,
  `CREATE TABLE ci_running_builds (
    id bigint NOT NULL,
    build_id bigint NOT NULL,
    project_id bigint NOT NULL,
    runner_id bigint NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    runner_type smallint NOT NULL,
    partition_id bigint NOT NULL,
    runner_owner_namespace_xid bigint\n  )`,
  `CREATE TABLE ci_builds_runner_session (
    id bigint NOT NULL,
    url character varying NOT NULL,
    certificate character varying,
    "authorization" character varying,
    build_id bigint NOT NULL,
    partition_id bigint NOT NULL,
    project_id bigint,
    CONSTRAINT check_2eb15fa9f3 CHECK ((project_id IS NOT NULL))\n  )`,
  `CREATE TABLE ci_resource_groups (
    id bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    project_id bigint NOT NULL,
    key character varying(255) NOT NULL,
    process_mode smallint DEFAULT 0 NOT NULL\n  )`,
  `CREATE TABLE ci_resources (
    id bigint NOT NULL,
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    resource_group_id bigint NOT NULL,
    build_id bigint,
    partition_id bigint,
    project_id bigint,
    CONSTRAINT check_f3eccb9d35 CHECK ((project_id IS NOT NULL))\n  )`,
  ...["ci_pending_builds", "ci_running_builds", "ci_builds_runner_session", "ci_resource_groups", "ci_resources"]
    .flatMap((table) => [
      `CREATE SEQUENCE ${table}_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
      `ALTER SEQUENCE ${table}_id_seq OWNED BY ${table}.id`,
      `ALTER TABLE ONLY ${table} ALTER COLUMN id SET DEFAULT nextval('${table}_id_seq'::regclass)`,
      `ALTER TABLE ONLY ${table} ADD CONSTRAINT ${table}_pkey PRIMARY KEY (id)`
    ]),
  `CREATE UNIQUE INDEX index_ci_pending_builds_on_build_id ON ci_pending_builds USING btree (build_id)`,
  `CREATE INDEX index_ci_pending_builds_on_created_at_and_id ON ci_pending_builds USING btree (created_at, id)`,
  `CREATE UNIQUE INDEX index_ci_pending_builds_on_partition_id_build_id ON ci_pending_builds USING btree (partition_id, build_id)`,
  `CREATE UNIQUE INDEX index_ci_running_builds_on_build_id ON ci_running_builds USING btree (build_id)`,
  `CREATE UNIQUE INDEX index_ci_running_builds_on_partition_id_build_id ON ci_running_builds USING btree (partition_id, build_id)`,
  `CREATE UNIQUE INDEX index_ci_builds_runner_session_on_build_id ON ci_builds_runner_session USING btree (build_id)`,
  `CREATE UNIQUE INDEX index_ci_builds_runner_session_on_partition_id_build_id ON ci_builds_runner_session USING btree (partition_id, build_id)`,
  `CREATE UNIQUE INDEX index_ci_resource_groups_on_project_id_and_key ON ci_resource_groups USING btree (project_id, key)`,
  `CREATE INDEX index_ci_resources_on_build_id ON ci_resources USING btree (build_id)`,
  `CREATE UNIQUE INDEX index_ci_resources_on_resource_group_id_and_build_id ON ci_resources USING btree (resource_group_id, build_id)`
]

export interface GitLabLayout {
  /** Also GitLab's runner tables (ci_runners and its project and group assignments). */
  readonly runners?: boolean
  /** GitLab ≥ 16: p_ci_builds with partitions 100 and 101. Else the older plain ci_builds. */
  readonly partitioned: boolean
  /**
   * Leave out GitLab's (status, created_at, project_id) index, so the canceling scan has no index
   * serving it (doctor must recommend one).
   */
  readonly withoutStatusIndex?: boolean
  /**
   * Leave out the pipelines and the tables a build's transition touches (queue, running builds,
   * runner sessions, resources): a database where a drop can only write the build's row.
   */
  readonly withoutTransitionTables?: boolean
}

/** Pipelines: p_ci_pipelines with partitions 100 and 101, or the older plain ci_pipelines. */
const pipelines = (layout: GitLabLayout) => {
  if (!layout.partitioned) {
    return [
      `CREATE TABLE ci_pipelines (${
        pipelineColumns.replace("partition_id bigint NOT NULL", "partition_id bigint DEFAULT 100 NOT NULL")
      }\n  )`,
      `ALTER TABLE ONLY ci_pipelines ADD CONSTRAINT ci_pipelines_pkey PRIMARY KEY (id)`,
      `CREATE INDEX index_ci_pipelines_on_status_and_id ON ci_pipelines USING btree (status, id)`
    ]
  }
  return [
    `CREATE TABLE p_ci_pipelines (${pipelineColumns}\n  ) PARTITION BY LIST (partition_id)`,
    `CREATE SEQUENCE ci_pipelines_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
    `CREATE TABLE ci_pipelines PARTITION OF p_ci_pipelines FOR VALUES IN (100)`,
    `CREATE TABLE gitlab_partitions_dynamic.ci_pipelines_101 PARTITION OF p_ci_pipelines FOR VALUES IN (101)`,
    `ALTER TABLE ONLY ci_pipelines ALTER COLUMN id SET DEFAULT nextval('ci_pipelines_id_seq'::regclass)`,
    `ALTER TABLE p_ci_pipelines ADD CONSTRAINT p_ci_pipelines_pkey PRIMARY KEY (id, partition_id)`,
    `CREATE INDEX p_ci_pipelines_status_id_idx ON p_ci_pipelines USING btree (status, id)`
  ]
}

const builds = (layout: GitLabLayout) => {
  const indexes = buildIndexes.filter(([name]) =>
    !(layout.withoutStatusIndex === true && name.includes("status_created_at"))
  )
  if (!layout.partitioned) {
    return [
      `CREATE TABLE ci_builds (${
        buildColumns.replace("partition_id bigint NOT NULL", "partition_id bigint DEFAULT 100 NOT NULL")
      }\n  )`,
      `ALTER TABLE ONLY ci_builds ADD CONSTRAINT ci_builds_pkey PRIMARY KEY (id)`,
      ...indexes.map(([, suffix, definition]) =>
        `CREATE INDEX index_ci_builds_on_${suffix.replace(/_idx$/, "")} ON ci_builds USING btree ${definition}`
      )
    ]
  }
  const partitions = [["ci_builds", "ci_builds", 100], [
    "gitlab_partitions_dynamic.ci_builds_101",
    "ci_builds_101",
    101
  ]] as const
  return [
    `CREATE SCHEMA IF NOT EXISTS gitlab_partitions_dynamic`,
    `CREATE TABLE p_ci_builds (${buildColumns}\n  ) PARTITION BY LIST (partition_id)`,
    `CREATE SEQUENCE ci_builds_id_seq START WITH 1 INCREMENT BY 1 NO MINVALUE NO MAXVALUE CACHE 1`,
    ...partitions.map(([qualified, , value]) =>
      `CREATE TABLE ${qualified} PARTITION OF p_ci_builds FOR VALUES IN (${value})`
    ),
    `ALTER TABLE ONLY ci_builds ALTER COLUMN id SET DEFAULT nextval('ci_builds_id_seq'::regclass)`,
    // The primary key GitLab has: (id, partition_id), on the parent and every partition.
    `ALTER TABLE p_ci_builds ADD CONSTRAINT p_ci_builds_pkey PRIMARY KEY (id, partition_id)`,
    ...indexes.flatMap(([name, suffix, definition]) => [
      `CREATE INDEX ${name} ON ONLY p_ci_builds USING btree ${definition}`,
      ...partitions.flatMap(([qualified, bare]) => [
        `CREATE INDEX ${bare}_${suffix} ON ${qualified} USING btree ${definition}`,
        `ALTER INDEX ${name} ATTACH PARTITION ${
          qualified.includes(".") ? "gitlab_partitions_dynamic." : ""
        }${bare}_${suffix}`
      ])
    ])
  ]
}

/** Lays out GitLab's tables on the database of the PgClient in context (an empty one). */
export const createGitLabSchema = (layout: GitLabLayout) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const runnerTables = layout.runners === true ? runners : []
    const transition = layout.withoutTransitionTables === true ? [] : [...pipelines(layout), ...transitionTables]
    for (
      const statement of [
        ...namespaces,
        ...projects,
        ...issues,
        ...exportJobs,
        ...builds(layout),
        ...transition,
        ...runnerTables
      ]
    ) {
      yield* sql.unsafe(statement)
    }
  })

/** Every index in the database, as pg_dump would define it. */
export const allIndexes = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<{ schemaname: string; tablename: string; indexname: string; indexdef: string }>`
    SELECT schemaname, tablename, indexname, indexdef FROM pg_indexes
    WHERE schemaname IN ('public', 'gitlab_partitions_dynamic') ORDER BY schemaname, tablename, indexname`
})

/** Every column of every table that is not Sweeper's. */
export const gitlabColumns = Effect.gen(function*() {
  const sql = yield* PgClient.PgClient
  return yield* sql<Record<string, unknown>>`
    SELECT table_schema, table_name, column_name, ordinal_position, data_type, is_nullable, column_default, character_maximum_length
    FROM information_schema.columns
    WHERE table_schema IN ('public', 'gitlab_partitions_dynamic') AND table_name NOT LIKE 'sweeper\\_%'
    ORDER BY table_schema, table_name, ordinal_position`
})

/**
 * GitLab's write lock on these tables, the copies this database keeps but does not own (its
 * `gitlab:db:lock_writes`): its function `gitlab_schema_prevent_write()` and, on each table, the
 * trigger `gitlab_schema_write_trigger_for_<table>` that refuses INSERT, UPDATE, DELETE and
 * TRUNCATE, as GitLab installs them.
 */
export const lockWrites = (tables: ReadonlyArray<string>) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    yield* sql.unsafe(`CREATE OR REPLACE FUNCTION gitlab_schema_prevent_write() RETURNS trigger LANGUAGE plpgsql AS $$
      BEGIN
        RAISE EXCEPTION 'Table: "%" is write protected within this Gitlab database.', TG_TABLE_NAME
          USING ERRCODE = 'modifying_sql_data_not_permitted',
          HINT = 'Make sure you are using the right database connection';
      END $$`)
    for (const table of tables) {
      yield* sql.unsafe(`CREATE TRIGGER ${WRITE_LOCK_TRIGGER_PREFIX}${table}
        BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON ${table}
        FOR EACH STATEMENT EXECUTE FUNCTION gitlab_schema_prevent_write()`)
    }
  })

/**
 * A decomposed GitLab's write locks: on the database named, every table GitLab keeps in the other
 * one that is present here.
 */
export const lockWritesOfOthers = (database: DatabaseName) =>
  Effect.gen(function*() {
    const sql = yield* PgClient.PgClient
    const present = yield* sql<{ name: string }>`SELECT name FROM unnest(${Object.keys(GITLAB_SCHEMAS)}::text[]) AS name
      WHERE to_regclass(name) IS NOT NULL`
    yield* lockWrites(present.map(({ name }) => name).filter((name) => databaseOfTable(name) !== database))
  })
